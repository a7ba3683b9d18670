"""A whole simulated job at once, as Arrow tables (no real time, no agents).

``fleetscope simulate`` plays a job in real time through simulated agents; this plays
the same step model (:class:`~fleetscope.sim.schedule.StepModel`) and row builder
(:class:`~fleetscope.sim.stream.Fleet`) to the end in one go and returns every record
type as one table, ready for one ``POST /ingest``: ``fleetscope demo --synthetic`` posts
it, so the demo's synthetic job and the fleet simulator are the same generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from fleetscope.sim.faults import FaultPlan, parse_sim_fault
from fleetscope.sim.schedule import StepModel, Timing
from fleetscope.sim.stream import Fleet, Periods

from fleetscope.topology import Topology

DEMO_STRAGGLER = "straggler:rank=5:factor=1.3:from_step=10"
"""The demo job's fault: rank 5 computes 1.3x slower from step 10."""


def job_tables(topo: Topology, num_steps: int, t0_ns: int, *, job: str, faults: Sequence[str] = (),
               num_mb: int = 2, step_ms: float = 400.0, tp_ops: int = 1, gpus_per_host: int = 4,
               host_prefix: str = "h", seed: int = 0, job_row: dict[str, Any] | None = None) -> dict[str, pa.Table]:
    """Every record of ``num_steps`` steps of a DP x PP x TP job starting at ``t0_ns``.

    Args:
        faults: ``--inject`` specs (``fleetscope train``'s, plus ``host_down``).
        step_ms: the target step time (:class:`~fleetscope.sim.schedule.Timing`).
        host_prefix: hosts are ``f"{host_prefix}{h}"``, ``gpus_per_host`` ranks each.
        job_row: fields of the job's ``jobs`` record (besides ``job`` and ``ts_ns``).

    Returns:
        record type -> table (sections, collectives, steps, inflight, heartbeats,
        metrics, jobs), each conforming to :data:`fleetscope.schema.RECORD_TYPES`.

    Raises:
        ValueError: a bad fault spec or a negative step count.
    """
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps}")
    num_hosts = -(-topo.world_size // gpus_per_host)
    plan = FaultPlan([parse_sim_fault(s, topo.world_size, num_hosts) for s in faults], topo.world_size,
                     gpus_per_host)
    model = StepModel(topo, num_mb, tp_ops, Timing(step_ms=step_ms), plan, seed=seed)
    fleet = Fleet(model.layout, job, t0_ns, gpus_per_host, [f"{host_prefix}{h}" for h in range(num_hosts)],
                  num_mb, tokens_per_step=0, periods=Periods(), seed=seed)
    fleet.set_phase(model.phase)
    fleet.add_job_row(0.0, **{"dp": topo.dp, "tp": topo.tp, "pp": topo.pp, "order": topo.order,
                              "num_microbatches": num_mb, **(job_row or {})})
    clock = np.zeros(model.layout.shape)
    for step in range(num_steps):
        out = model.play(step, clock)
        fleet.add_step(out)
        clock = out.end
    finite = clock[np.isfinite(clock)]
    end_rel = float(finite.max()) if finite.size else 0.0
    return {name: table for name, (table, _) in fleet.take(end_rel).items()}


def demo_tables(job: str, num_steps: int, t0_ns: int) -> dict[str, pa.Table]:
    """``fleetscope demo --synthetic``'s job: dp=2 tp=2 pp=2, 2 micro-batches, 400 ms
    steps, on two hosts ``demo-host-{0,1}``, with :data:`DEMO_STRAGGLER`."""
    return job_tables(
        Topology(dp=2, tp=2, pp=2), num_steps, t0_ns, job=job, faults=[DEMO_STRAGGLER], num_mb=2,
        step_ms=400.0, host_prefix="demo-host-",
        job_row={"name": "demo 3D job", "model_flops_per_step": 3.2e12, "device_name": "cpu",
                 "device_peak_flops": 1e12, "command": "fleetscope demo"})
