"""fleetscope.server.api"""
