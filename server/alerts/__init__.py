"""fleetscope.server.alerts"""
