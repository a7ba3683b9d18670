"""fleetscope.trainer_hooks"""
