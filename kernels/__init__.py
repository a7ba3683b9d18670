"""fleetscope.kernels: self-check probes that find slow or faulty hosts (MegaScale §4.3).

Probes (each a small torch program with a CPU and a GPU path, a time budget and
progress output): :mod:`.matmul` (dense GEMM throughput vs. peak), :mod:`.membw`
(STREAM copy/triad), :mod:`.numerics` (bit-exact deterministic computation),
:mod:`.collectives` (all-reduce / all-to-all bus bandwidth, p2p per device pair).
:mod:`.suite` runs them on a host (``fleetscope selfcheck``, :mod:`.cli`);
:mod:`.preflight` runs the quick suite on every rank of a job before step 0.
Results become ``probes`` records (:meth:`.result.ProbeResult.to_record`), shipped by
:mod:`.ship`; the server scores them (``fleetscope.server.diagnosis.selfcheck``).
"""
