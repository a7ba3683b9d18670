"""fleetscope.server.diagnosis"""
