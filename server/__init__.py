"""fleetscope.server"""
