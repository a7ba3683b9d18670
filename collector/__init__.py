"""fleetscope.collector"""
