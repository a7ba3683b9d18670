"""fleetscope.agent"""
