"""Synthetic event builder (tests, benches): a 3D-parallel job played step by step.

Emits ``sections``, ``collectives`` and ``steps`` frames with the schema's columns and
the same semantics as the trainer: forward/backward per micro-batch with the TP
all-reduce nested inside, 1F1B p2p between stages (recv waits for the matching send),
a DP all-reduce per stage after the pipeline, then the optimizer. A collective
completes ``link`` after its last member arrived, so waits and lateness are real.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from fleetscope.server.diagnosis.whatif import schedule_order

from fleetscope.topology import Topology

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


@dataclass
class SynthJob:
    topo: Topology = field(default_factory=lambda: Topology(dp=2, tp=2, pp=2))
    num_steps: int = 30
    num_mb: int = 4
    fwd_ms: float = 10.0
    bwd_ms: float = 20.0
    dl_ms: float = 5.0
    opt_ms: float = 4.0
    tp_link_ms: float = 0.5
    pp_link_ms: float = 0.5
    dp_link_ms: float = 3.0
    noise: float = 0.02
    seed: int = 0
    compute_factor: Callable[[int, int], float] = lambda rank, step: 1.0
    dl_factor: Callable[[int, int], float] = lambda rank, step: 1.0
    pause_ms: Callable[[int, int], float] = lambda rank, step: 0.0
    """Untimed host pause before the step's work (GC-like or launch skew)."""
    link_factor: Callable[[str, int], float] = lambda gid, step: 1.0
    job: str = "synth"
    t0_ns: int = T0

    def build(self) -> dict[str, pd.DataFrame]:
        rng = np.random.default_rng(self.seed)
        topo, n = self.topo, self.topo.world_size
        sec, col, stp = [], [], []
        seq: dict[tuple[str, int], int] = defaultdict(int)
        clock = np.full(n, float(self.t0_ns))

        def jitter(x: float) -> float:
            return x * max(0.2, 1.0 + self.noise * rng.standard_normal())

        def collective(ranks, gid, axis, op, step, mb, nbytes, link_ms):
            enq = {r: clock[r] for r in ranks}
            done = max(enq.values()) + jitter(link_ms * self.link_factor(gid, step)) * MS
            for gr, r in enumerate(ranks):
                seq[(gid, r)] += 1
                col.append(_coll(self.job, r, step, mb, gid, axis, gr, len(ranks), seq[(gid, r)],
                                 op, nbytes, -1, enq[r], done))
                clock[r] = done

        for step in range(self.num_steps):
            start = clock.copy()
            for r in range(n):
                clock[r] += self.pause_ms(r, step) * MS
                d = jitter(self.dl_ms * self.dl_factor(r, step)) * MS
                sec.append(_sec(self.job, r, step, -1, "dataloader", "dataloader", clock[r], clock[r] + d))
                clock[r] += d
            pending_send: dict[tuple[str, int, int, int], float] = {}
            for dp in range(topo.dp):
                self._pipeline(dp, step, clock, sec, col, seq, pending_send, jitter, collective)
            for s in range(topo.pp):
                for t in range(topo.tp):
                    g = topo.group_ranks("dp", topo.rank(dp=0, pp=s, tp=t))
                    collective(g, topo.group_id("dp", g[0]), "dp", "all_reduce", step, -1, 4 << 20, self.dp_link_ms)
            for r in range(n):
                d = jitter(self.opt_ms) * MS
                sec.append(_sec(self.job, r, step, -1, "optimizer", "optimizer", clock[r], clock[r] + d))
                clock[r] += d
                stp.append({"job": self.job, "attempt": 0, "rank": r, "host": f"h{r // 4}", "step": step,
                            "start_ns": int(start[r]), "end_ns": int(clock[r]),
                            "duration_ns": int(clock[r] - start[r]), "num_microbatches": self.num_mb,
                            "tokens": 0, "loss": float("nan")})
        return {"sections": pd.DataFrame(sec), "collectives": pd.DataFrame(col), "steps": pd.DataFrame(stp)}

    def _pipeline(self, dp, step, clock, sec, col, seq, pending, jitter, collective):
        topo, num_stages = self.topo, self.topo.pp
        orders = [schedule_order(s, num_stages, self.num_mb, "1f1b") for s in range(num_stages)]
        pos = [0] * num_stages
        remaining = sum(len(o) for o in orders)
        while remaining:
            for s in range(num_stages):
                while pos[s] < len(orders[s]):
                    op, m = orders[s][pos[s]]
                    src_stage = s - 1 if op == "F" else s + 1
                    needs = 0 <= src_stage < num_stages
                    cell = topo.group_ranks("tp", topo.rank(dp=dp, pp=s, tp=0))
                    if needs and any((op, src_stage, m, t) not in pending for t in range(topo.tp)):
                        break
                    for t, r in enumerate(cell):
                        if needs:
                            peer = topo.rank(dp=dp, pp=src_stage, tp=t)
                            send_enq = pending.pop((op, src_stage, m, t))
                            gid = topo.group_id("pp", r)
                            done = max(clock[r], send_enq) + jitter(self.pp_link_ms * self.link_factor(gid, step)) * MS
                            seq[(gid, r)] += 1
                            col.append(_coll(self.job, r, step, m, gid, "pp", s, num_stages, seq[(gid, r)],
                                             "recv", 1 << 20, peer, clock[r], done))
                            clock[r] = done
                    base = self.fwd_ms if op == "F" else self.bwd_ms
                    starts = {r: clock[r] for r in cell}
                    for r in cell:
                        clock[r] += jitter(base * self.compute_factor(r, step)) * MS
                    collective(cell, topo.group_id("tp", cell[0]), "tp", "all_reduce", step, m, 1 << 18, self.tp_link_ms)
                    for r in cell:
                        name = "forward" if op == "F" else "backward"
                        sec.append(_sec(self.job, r, step, m, name, "compute", starts[r], clock[r]))
                    dst_stage = s + 1 if op == "F" else s - 1
                    if 0 <= dst_stage < num_stages:
                        for t, r in enumerate(cell):
                            peer = topo.rank(dp=dp, pp=dst_stage, tp=t)
                            gid = topo.group_id("pp", r)
                            seq[(gid, r)] += 1
                            col.append(_coll(self.job, r, step, m, gid, "pp", s, num_stages, seq[(gid, r)],
                                             "send", 1 << 20, peer, clock[r], clock[r] + 0.01 * MS))
                            pending[(op, s, m, t)] = clock[r]
                            clock[r] += 0.01 * MS
                    pos[s] += 1
                    remaining -= 1


def _sec(job, rank, step, mb, name, kind, start, end):
    return {"job": job, "attempt": 0, "rank": rank, "host": f"h{rank // 4}", "step": step,
            "microbatch": mb, "name": name, "kind": kind, "start_ns": int(start), "end_ns": int(end),
            "duration_ns": int(end - start), "device_ns": -1}


def _coll(job, rank, step, mb, gid, axis, grank, gsize, seq, op, nbytes, peer, enq, done):
    return {"job": job, "attempt": 0, "rank": rank, "host": f"h{rank // 4}", "step": step,
            "microbatch": mb, "group_id": gid, "axis": axis, "group_rank": grank, "group_size": gsize,
            "seq": seq, "op": op, "bytes": nbytes, "dtype": "float32", "peer": peer,
            "state": "completed", "enqueued_ns": int(enq), "started_ns": int(enq),
            "completed_ns": int(done), "duration_ns": int(done - enq)}
