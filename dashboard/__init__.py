"""fleetscope.dashboard"""
