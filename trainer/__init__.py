"""fleetscope.trainer: the reference 3D-parallel (DP x TP x PP) GPT job, with fault injection.

Run it with ``fleetscope train`` (see :mod:`fleetscope.trainer.cli`); one rank is
:func:`fleetscope.trainer.train.run_rank`.
"""
