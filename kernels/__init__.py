"""fleetscope.kernels"""
