"""fleetscope.trainer"""
