"""fleetscope.sim: a fleet simulator that plays a 3D-parallel job of any size.

``fleetscope simulate`` generates, vectorised with numpy and Arrow, the telemetry the
real hooks and agents of a DP x PP x TP job would produce (jobs, steps, sections per
micro-batch, TP/DP collectives and PP p2p with per-group sequence numbers, in-flight
liveness rows, host and rank heartbeats, GPU/host metrics) with the schedule semantics
of the reference trainer (1F1B, TP lock-step, DP sync: a late rank makes its peers
wait), and ships it in real time through the agent's own transport, one simulated
agent per host. Faults are the ``fleetscope train`` specs plus ``host_down``; the
ground truth goes to ``--results``, never into the telemetry.

Modules: :mod:`.faults` (specs), :mod:`.schedule` (one step, vectorised),
:mod:`.stream` (rows over real time, per host), :mod:`.agents` (shipping),
:mod:`.runner` (the loop, progress, results), :mod:`.cli`.
"""
