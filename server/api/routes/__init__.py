"""fleetscope.server.api.routes"""
