"""Synthetic jobs for tests and benches: the fleet simulator's step model as pandas frames.

:class:`SynthJob` is a thin front end over :class:`fleetscope.sim.schedule.StepModel`
(the one generator of synthetic telemetry): it gives the model explicit part durations
(``fwd_ms`` ...) and, per step, the per-rank factors its callables return, and turns the
model's arrays into ``sections``, ``collectives`` and ``steps`` frames with the schema's
columns. The schedule is therefore the reference trainer's: a ``dataloader`` section;
the non-interleaved 1F1B pipeline with blocking p2p (a send completes when its receive
is posted too) and the paired steady-state exchanges; one TP all-reduce inside every
``forward`` / ``backward`` section (the last stage's LM head adds an ``all_gather``
forward and an ``all_reduce`` backward); a ``grad_sync`` section around the DP
all-reduce; ``optimizer``. A collective completes its link time after its last member
arrived, so waits and lateness are real.

Hosts are ``h{rank // 4}``; times are ``t0_ns`` + the model's ns; every rank starts the
job at ``t0_ns`` and each step where its previous one ended (no gap between steps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from fleetscope.sim.schedule import (
    AXES,
    DTYPES,
    OPS,
    SECTION_KINDS,
    SECTIONS,
    StepFactors,
    StepModel,
    Timing,
)

from fleetscope.topology import Topology

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
GPUS_PER_HOST = 4
TP_BYTES, PP_BYTES, DP_BYTES = 1 << 18, 1 << 20, 4 << 20


@dataclass
class SynthJob:
    """A DP x PP x TP job of ``num_steps`` steps; durations in ms; factors per (rank, step)."""

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
    """Relative standard deviation of every duration (log-normal jitter)."""
    seed: int = 0
    compute_factor: Callable[[int, int], float] = lambda rank, step: 1.0
    dl_factor: Callable[[int, int], float] = lambda rank, step: 1.0
    pause_ms: Callable[[int, int], float] = lambda rank, step: 0.0
    """Untimed host pause before the step's work (GC-like or launch skew)."""
    link_factor: Callable[[str, int], float] = lambda gid, step: 1.0
    job: str = "synth"
    t0_ns: int = T0
    cpu_clock: bool = False
    """Sections carry ``cpu_ns`` (4/5 of their wall time, as the hooks measure it on a CPU
    device); False: -1, not measured (a GPU job)."""

    def model(self) -> StepModel:
        """The step model with this job's durations (no persistent per-rank speed spread:
        every rank is as fast as the next unless a factor says otherwise)."""
        parts = {"forward": self.fwd_ms * MS, "backward": self.bwd_ms * MS, "dataloader": self.dl_ms * MS,
                 "optimizer": self.opt_ms * MS, "tp_link": self.tp_link_ms * MS, "pp_link": self.pp_link_ms * MS,
                 "dp_link": self.dp_link_ms * MS, "grad_sync": 0.0, "gap": 0.0}
        return StepModel(self.topo, self.num_mb, tp_ops=1, timing=Timing(noise=self.noise, rank_spread=0.0),
                         seed=self.seed, parts_ns=parts, record_inflight=False, act_bytes=PP_BYTES,
                         grad_bytes=DP_BYTES, tp_bytes=TP_BYTES)

    def factors(self, step: int, group_names: list[str]) -> StepFactors:
        ranks = range(self.topo.world_size)
        return StepFactors(
            compute=np.array([self.compute_factor(r, step) for r in ranks], dtype=np.float64),
            dataloader=np.array([self.dl_factor(r, step) for r in ranks], dtype=np.float64),
            pause_ns=np.array([self.pause_ms(r, step) * MS for r in ranks], dtype=np.float64),
            link=np.array([self.link_factor(g, step) for g in group_names], dtype=np.float64))

    def build(self) -> dict[str, pd.DataFrame]:
        """``{"sections", "collectives", "steps"}`` frames of the whole job."""
        model = self.model()
        names = model.layout.group_names
        clock = np.zeros(model.layout.shape)
        outs = []
        for step in range(self.num_steps):
            out = model.play(step, clock, self.factors(step, names))
            clock = out.end
            outs.append(out)
        cat = {k: {c: np.concatenate([getattr(o, k)[c] for o in outs]) for c in getattr(outs[0], k)}
               for k in ("sections", "collectives", "steps")} if outs else None
        if cat is None:
            return {"sections": pd.DataFrame(columns=list(SECTION_COLUMNS)),
                    "collectives": pd.DataFrame(columns=list(COLLECTIVE_COLUMNS)),
                    "steps": pd.DataFrame(columns=list(STEP_COLUMNS))}
        return {"sections": self._sections(cat["sections"]), "collectives": self._collectives(cat["collectives"], names),
                "steps": self._steps(cat["steps"])}

    # ------------------------------------------------------------------ frames
    def _abs(self, rel: np.ndarray) -> np.ndarray:
        return self.t0_ns + np.rint(rel).astype(np.int64)

    def _ident(self, rank: np.ndarray) -> dict[str, object]:
        rank = rank.astype(np.int64)
        hosts = np.array([f"h{h}" for h in range(int(rank.max(initial=0)) // GPUS_PER_HOST + 1)], dtype=object)
        return {"job": self.job, "attempt": 0, "rank": rank, "host": hosts[rank // GPUS_PER_HOST]}

    def _sections(self, c: dict[str, np.ndarray]) -> pd.DataFrame:
        order = np.lexsort((c["rank"], c["start"], c["step"]))
        c = {k: v[order] for k, v in c.items()}
        start, end = self._abs(c["start"]), self._abs(c["end"])
        name = c["name"].astype(np.int64)
        return pd.DataFrame({
            **self._ident(c["rank"]), "step": c["step"].astype(np.int64),
            "microbatch": c["microbatch"].astype(np.int64),
            "name": np.array(SECTIONS, dtype=object)[name], "kind": np.array(SECTION_KINDS, dtype=object)[name],
            "start_ns": start, "end_ns": end, "duration_ns": end - start, "device_ns": np.full(start.size, -1),
            "cpu_ns": (end - start) * 4 // 5 if self.cpu_clock else np.full(start.size, -1)},
            columns=list(SECTION_COLUMNS))  # fmt: skip

    def _collectives(self, c: dict[str, np.ndarray], names: list[str]) -> pd.DataFrame:
        order = np.lexsort((c["rank"], c["enq"], c["step"]))
        c = {k: v[order] for k, v in c.items()}
        enq, done = self._abs(c["enq"]), self._abs(c["done"])
        n = enq.size
        return pd.DataFrame({
            **self._ident(c["rank"]), "step": c["step"].astype(np.int64),
            "microbatch": c["microbatch"].astype(np.int64),
            "group_id": np.array(names, dtype=object)[c["gidx"]],
            "axis": np.array(AXES, dtype=object)[c["axis"].astype(np.int64)],
            "group_rank": c["group_rank"].astype(np.int64), "group_size": c["group_size"].astype(np.int64),
            "seq": c["seq"].astype(np.int64), "op": np.array(OPS, dtype=object)[c["op"].astype(np.int64)],
            "bytes": c["bytes"].astype(np.int64), "dtype": np.array(DTYPES, dtype=object)[c["dtype"].astype(np.int64)],
            "peer": c["peer"].astype(np.int64), "state": np.full(n, "completed", dtype=object),
            "enqueued_ns": enq, "started_ns": enq, "completed_ns": done, "duration_ns": done - enq},
            columns=list(COLLECTIVE_COLUMNS))  # fmt: skip

    def _steps(self, c: dict[str, np.ndarray]) -> pd.DataFrame:
        order = np.lexsort((c["rank"], c["step"]))
        c = {k: v[order] for k, v in c.items()}
        start, end = self._abs(c["start"]), self._abs(c["end"])
        n = start.size
        return pd.DataFrame({
            **self._ident(c["rank"]), "step": c["step"].astype(np.int64), "start_ns": start, "end_ns": end,
            "duration_ns": end - start, "num_microbatches": np.full(n, self.num_mb, dtype=np.int64),
            "tokens": np.zeros(n, dtype=np.int64), "loss": np.full(n, np.nan)},
            columns=list(STEP_COLUMNS))  # fmt: skip


SECTION_COLUMNS = ("job", "attempt", "rank", "host", "step", "microbatch", "name", "kind", "start_ns", "end_ns",
                   "duration_ns", "device_ns", "cpu_ns")
COLLECTIVE_COLUMNS = ("job", "attempt", "rank", "host", "step", "microbatch", "group_id", "axis", "group_rank",
                      "group_size", "seq", "op", "bytes", "dtype", "peer", "state", "enqueued_ns", "started_ns",
                      "completed_ns", "duration_ns")
STEP_COLUMNS = ("job", "attempt", "rank", "host", "step", "start_ns", "end_ns", "duration_ns", "num_microbatches",
                "tokens", "loss")


def whatif_vs_measured(topo: Topology, stage: int, factor: float,
                       noise: float = 0.0) -> tuple[float | None, float, int]:
    """One compute straggler (``factor`` from step 10, on the last dp/tp coordinate of
    ``stage``): its finding's ``est_slowdown`` (None when not found), the measured
    slowdown (median job step with it over the same job's without it, steps >= 12) and
    its rank."""
    from fleetscope.server.diagnosis.breakdown import rank_step_breakdown
    from fleetscope.server.diagnosis.stragglers import detect_stragglers
    from fleetscope.server.diagnosis.whatif import profile_from_frames

    rank = topo.rank(dp=topo.dp - 1, pp=stage, tp=topo.tp - 1)
    slow = SynthJob(topo=topo, noise=noise, num_steps=30,
                    compute_factor=lambda r, s: factor if r == rank and s >= 10 else 1.0)
    f = slow.build()
    bd, arr = rank_step_breakdown(f["sections"], f["collectives"], f["steps"])
    last = bd["step"].max() - 7
    prof = profile_from_frames(topo, slow.num_mb, bd[bd.step >= last],
                               f["sections"][f["sections"].step >= last], arr[arr.step >= last])
    found = [x for x in detect_stragglers("t", topo, bd, arr, prof) if rank in x.ranks]
    c = SynthJob(topo=topo, noise=noise, num_steps=30).build()
    bdc = rank_step_breakdown(c["sections"], c["collectives"], c["steps"])[0]

    def step(b: pd.DataFrame) -> float:
        return b[b.step >= 12].groupby("step")["step_ns"].max().median()

    return (found[0].est_slowdown if found else None), step(bd) / step(bdc) - 1, rank
