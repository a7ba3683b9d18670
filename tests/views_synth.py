"""A small, realistic 3D-parallel job as telemetry rows, for the dashboard/view tests.

A thin front end over the fleet simulator's step model
(:class:`fleetscope.sim.schedule.StepModel`, the one generator of synthetic telemetry)
and its row builder (:class:`fleetscope.sim.stream.Fleet`): this file sets the part
durations (``fwd_ms``, ``bwd_ms``; the rest fixed below) and the faults, as the same
``--inject`` specs ``fleetscope train`` takes, and turns the tables into lists of row
dicts for a JSON ``POST /ingest``. The schedule is therefore the reference trainer's:
per step a ``dataloader`` section, the 1F1B pipeline of forward/backward micro-batches
(blocking p2p send/recv between stages, the paired steady-state exchanges), a TP
all-reduce inside every forward/backward that waits for the slowest TP peer (the last
stage's LM head adds an all_gather forward and an all_reduce backward), a ``grad_sync``
section around the DP all-reduce, then the optimizer.

Faults: a straggler rank (``straggler:rank=R:factor=F:from_step=S``, compute slowed by
a factor from a step on) and a hang (``hang:rank=R:step=S:where=compute``, the rank
stuck in forward micro-batch 0 of that step). A hung job ends at the hang step: the
ranks that finished their part of it have its records, the others none, and every rank
has one in-flight record, its latest sample taken a minute into the hang, which shows
who waits on whom (the hung rank in ``forward``, its TP peers in the all-reduce, the
others in the recv or the DP all-reduce they need next).

The agents' side is the fixture's own: one heartbeat per rank stamped when
:meth:`SynthJob.build` runs (the agents are alive now) and a GPU temperature series.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from fleetscope.sim.faults import FaultPlan, parse_sim_fault
from fleetscope.sim.schedule import StepModel, Timing, pipeline_program
from fleetscope.sim.stream import Fleet, Periods

from fleetscope.topology import Topology

MS = 1_000_000
HANG_FOR_NS = 60_000 * MS
"""How long into a hang the in-flight records are sampled."""
PARTS_MS = {"dataloader": 1.0, "optimizer": 1.5, "grad_sync": 0.0, "dp_link": 1.0, "tp_link": 0.1,
            "pp_link": 0.2, "gap": 0.0}
"""The fixed part durations (ms) besides ``fwd_ms`` / ``bwd_ms``."""
NOISE = 0.01
"""Relative standard deviation of every duration (the step model's log-normal jitter)."""
TOKENS = 4096


def one_f_one_b(stage: int, num_stages: int, num_mb: int) -> list[tuple[str, int]]:
    """The 1F1B op order of one pipeline stage: (``F``|``B``, micro-batch), from the
    step model's own program of that stage."""
    return [(ins[0], ins[1]) for ins in pipeline_program(stage, num_stages, num_mb) if ins[0] in ("F", "B")]


@dataclass
class SynthJob:
    job: str = "synth-job"
    topo: Topology = Topology(dp=2, tp=2, pp=2)
    num_steps: int = 30
    num_mb: int = 4
    t0_ns: int = 0
    fwd_ms: float = 4.0
    bwd_ms: float = 8.0
    straggler_rank: int = -1
    straggler_factor: float = 1.0
    straggler_from_step: int = 0
    hang_rank: int = -1
    hang_step: int = -1
    host_of_rank: int = 4
    """Ranks per host (host names ``node-0``, ``node-1``...)."""
    seed: int = 0

    def host(self, rank: int) -> str:
        return f"node-{rank // self.host_of_rank}"

    def faults(self) -> list[str]:
        """The job's faults as ``--inject`` specs."""
        specs = []
        if self.straggler_rank >= 0:
            specs.append(f"straggler:rank={self.straggler_rank}:factor={self.straggler_factor}"
                         f":from_step={self.straggler_from_step}")
        if self.hang_rank >= 0 and self.hang_step >= 0:
            specs.append(f"hang:rank={self.hang_rank}:step={self.hang_step}:where=compute")
        return specs

    def build(self) -> dict[str, list[dict]]:
        """Record type -> rows (sections, collectives, steps, inflight, heartbeats,
        metrics, jobs)."""
        topo = self.topo
        n = topo.world_size
        num_hosts = -(-n // self.host_of_rank)
        plan = FaultPlan([parse_sim_fault(s, n, num_hosts) for s in self.faults()], n, self.host_of_rank)
        parts = {k: v * MS for k, v in PARTS_MS.items()} | {"forward": self.fwd_ms * MS, "backward": self.bwd_ms * MS}
        model = StepModel(topo, self.num_mb, tp_ops=1, timing=Timing(noise=NOISE, rank_spread=0.0), faults=plan,
                          seed=self.seed, parts_ns=parts, act_bytes=1 << 20, grad_bytes=1 << 20, tp_bytes=1 << 20)
        fleet = Fleet(model.layout, self.job, self.t0_ns, self.host_of_rank,
                      [f"node-{h}" for h in range(num_hosts)], self.num_mb, TOKENS, Periods(), seed=self.seed)
        fleet.set_phase(model.phase)
        hangs = self.hang_rank >= 0 and self.hang_step >= 0
        last = self.hang_step if hangs else self.num_steps - 1
        clock = np.zeros(model.layout.shape)
        end_rel = 0.0
        for step in range(min(last + 1, self.num_steps)):
            out = model.play(step, clock)
            fleet.add_step(out)
            for t in (out.steps["end"], out.collectives["done"], out.sections["end"]):
                t = t[np.isfinite(t)]
                end_rel = max(end_rel, float(t.max(initial=0.0)))
            clock = out.end
        tables = fleet.take(end_rel + (HANG_FOR_NS if hangs else 0.0))
        rows = {k: _rows(tables[k][0]) if k in tables else [] for k in ("sections", "collectives", "steps")}
        latest: dict[int, dict] = {}
        if hangs and "inflight" in tables:
            for x in _rows(tables["inflight"][0]):
                if x["rank"] not in latest or x["ts_ns"] >= latest[x["rank"]]["ts_ns"]:
                    latest[x["rank"]] = x
        rows["inflight"] = [latest[r] for r in sorted(latest)]
        end = self.t0_ns + int(end_rel)
        last_step = {r: -1 for r in topo.ranks()}
        for s in rows["steps"]:
            last_step[s["rank"]] = max(last_step[s["rank"]], s["step"])
        beat = time.time_ns()
        rows["heartbeats"] = [{
            "ts_ns": beat, "job": self.job, "host": self.host(r), "rank": r, "local_rank": r % self.host_of_rank,
            "pid": 1000 + r, "alive": True, "last_record_ns": end, "last_step": last_step[r],
        } for r in topo.ranks()]  # fmt: skip
        rows["metrics"] = [{
            "ts_ns": int(self.t0_ns + i * (end - self.t0_ns) / 2), "job": self.job, "host": self.host(r), "rank": r,
            "source": "gpu", "device": f"gpu{r % 4}", "name": "gpu.temperature_c", "value": 60.0 + r + 3 * i,
        } for r in topo.ranks() for i in range(3)]  # fmt: skip
        rows["jobs"] = [self._jobs_row("running")]
        if not hangs:
            rows["jobs"].append({**self._jobs_row("finished"), "ts_ns": end})
        return rows

    def _jobs_row(self, status: str) -> dict:
        return {
            "ts_ns": self.t0_ns, "job": self.job, "name": "synthetic 1F1B job", "dp": self.topo.dp,
            "tp": self.topo.tp, "pp": self.topo.pp, "order": self.topo.order, "num_microbatches": self.num_mb,
            "model_flops_per_step": 4.0e12, "device_name": "cpu", "device_peak_flops": 1.0e14,
            "status": status, "host": self.host(0),
        }


def _rows(table) -> list[dict]:
    """A table's rows as dicts for JSON, a NaN (no loss on this stage) left to the
    schema's default."""
    return [{k: v for k, v in x.items() if v == v} for x in table.to_pylist()]


def span_rows(rec: dict, step: int) -> list[dict]:
    """The timeline route's span rows (sections, then collectives and p2p) of one step
    of a :meth:`SynthJob.build` record set, for building a ``pandas.DataFrame``."""
    sections = [
        {"rank": s["rank"], "step": s["step"], "mb": s["microbatch"], "name": s["name"], "kind": s["kind"],
         "cat": "section", "start_ns": s["start_ns"], "end_ns": s["end_ns"], "op": "", "group_id": "", "seq": -1,
         "peer": -1, "state": ""} for s in rec["sections"] if s["step"] == step
    ]  # fmt: skip
    comms = [
        {"rank": c["rank"], "step": c["step"], "mb": c["microbatch"], "name": c["op"], "kind": c["axis"],
         "cat": "p2p" if c["peer"] >= 0 else "collective", "start_ns": c["enqueued_ns"],
         "end_ns": c["completed_ns"], "op": c["op"], "group_id": c["group_id"], "seq": c["seq"],
         "peer": c["peer"], "state": c["state"]} for c in rec["collectives"] if c["step"] == step
    ]  # fmt: skip
    return sections + comms
