"""fleetscope.server.store"""
