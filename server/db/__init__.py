"""fleetscope.server.db"""
