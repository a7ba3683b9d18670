"""Job-wide fine-grained progress: the early hang signal (pure, no I/O).

In a healthy 3D-parallel job some rank completes a traced op - a collective, a p2p
transfer or a traced section (data loading, forward, backward, optimizer) - every few
milliseconds. A hang stops them all: the culprit never reaches or never finishes its op,
and every other rank soon blocks in a collective or p2p op that waits for it. So the
job is *op-stalled* when

    no rank completed any traced op for max(hang_op_min_s, hang_k x p99 over recent
    steps of the step's longest job-wide gap between consecutive completions)

while at least one rank is blocked in a collective/p2p op (a quiet job whose ranks all
compute or load data is busy, not hung). This fires as soon as the silence is clearly
longer than any silence the job had in its recent healthy steps, instead of waiting
for ``hang_k`` whole step times.

The silence is *certified* by the data, never inferred from missing data: every rank
writes its records in order (its in-flight liveness record every 0.5 s is written
together with, or after, every op it completed before), so once the store holds a
rank's in-flight record of time ``h`` *and every record the rank wrote before it*, the
rank completed nothing after its last stored completion up to ``h`` (less
:data:`CERTIFY_MARGIN_NS`). An agent has several batches on the wire at once, so the
store may hold a later batch of a host before an earlier one; the agent's heartbeat
therefore says, per rank, the newest in-flight time whose batch and every batch before
it are acknowledged (``acked_through_ns``), and ``h`` is the smaller of that and the
newest stored in-flight time (an older agent that does not say it: the stored one).
The job-wide silence is known up to ``min`` over the live ranks of ``h``; a rank with no
in-flight record disarms the signal (nothing is known about it), a rank whose process
is gone (and whose records the store holds) cannot complete anything. Late, stopped or
reordered shipping therefore shortens the certified silence instead of faking one.

The history excludes the attempt's first (warm-up) step and needs
``op_min_history_steps`` complete steps; before that only the step-stall rule applies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

PROGRESS_OPS_KINDS = ("collective", "p2p")
CERTIFY_MARGIN_NS = 1_000_000_000
"""An op completed just before an in-flight record may be flushed one flush period (0.5 s)
after it (its completion was queued after that poll, or waited for a CUDA event): the
certified horizon of a rank stops this much before its latest in-flight record."""


@dataclass(frozen=True)
class ProgressStall:
    """The job-wide progress state at one moment."""

    armed: bool
    """Enough healthy history and certified data to judge (``reason`` says why not)."""
    stalled: bool
    quiet_since_ns: int
    """Latest completion of any traced op anywhere in the job (0: none seen)."""
    horizon_ns: int
    """Time up to which every live rank's records are in the store (0: unknown)."""
    quiet_s: float
    """Certified job-wide silence: ``horizon - quiet_since``."""
    threshold_s: float
    history_gap_s: float
    """p99 over the history steps of each step's longest job-wide completion gap."""
    num_history_steps: int
    blocked_ranks: tuple[int, ...] = ()
    reason: str = ""

    def due_in_s(self) -> float | None:
        """Seconds until the silence would cross the threshold if nothing completes."""
        if not self.armed or self.stalled or self.quiet_since_ns <= 0:
            return None
        return max(self.threshold_s - self.quiet_s, 0.0)

    def evidence(self) -> dict:
        return {"quiet_since_ns": self.quiet_since_ns, "certified_until_ns": self.horizon_ns,
                "quiet_s": round(self.quiet_s, 3), "op_threshold_s": round(self.threshold_s, 3),
                "history_gap_s": round(self.history_gap_s, 4), "history_steps": self.num_history_steps,
                "blocked_in_ops": list(self.blocked_ranks)}


def completions(collectives: pd.DataFrame | None, sections: pd.DataFrame | None) -> pd.DataFrame:
    """Every completed traced op as rows ``(rank, step, t_ns)``."""
    parts = []
    if collectives is not None and not collectives.empty and "completed_ns" in collectives:
        c = collectives
        if "state" in c:
            c = c[c["state"] == "completed"]
        parts.append(pd.DataFrame({"rank": c["rank"], "step": c["step"], "t_ns": c["completed_ns"]}))
    if sections is not None and not sections.empty and "end_ns" in sections:
        parts.append(pd.DataFrame({"rank": sections["rank"], "step": sections["step"],
                                   "t_ns": sections["end_ns"]}))
    if not parts:
        return pd.DataFrame({"rank": pd.Series(dtype="int64"), "step": pd.Series(dtype="int64"),
                             "t_ns": pd.Series(dtype="int64")})
    out = pd.concat(parts, ignore_index=True).astype("int64")
    return out[out["t_ns"] > 0]


def step_gaps(events: pd.DataFrame) -> pd.Series:
    """Per step: the longest job-wide gap between consecutive completions.

    Events of all ranks are merged in time order; each gap belongs to the step of the
    completion that ends it (so the pause before a step's first op - data loading, a
    host stall - counts for that step).
    """
    if events.empty:
        return pd.Series(dtype="float64")
    e = events.sort_values("t_ns", kind="stable")
    t = e["t_ns"].to_numpy()
    gaps = np.diff(t, prepend=t[0]) / 1e9
    return pd.Series(gaps, index=e["step"].to_numpy()).groupby(level=0).max()


def progress_stall(
    now_ns: int,
    ranks: list[int],
    collectives: pd.DataFrame | None,
    sections: pd.DataFrame | None,
    inflight: pd.DataFrame | None,
    heartbeats: pd.DataFrame | None,
    last_step: int,
    first_step: int,
    *,
    hang_op_min_s: float,
    hang_k: float,
    min_history_steps: int,
    min_blocked_s: float,
    gaps: pd.Series | None = None,
    quiet_since_ns: int | None = None,
    reference: bool = False,
) -> ProgressStall:
    """Is the whole job silent - no traced op completing anywhere - for too long?

    Args:
        now_ns: the server's clock (used only for nothing-known cases).
        ranks: every rank of the job.
        collectives: window of ``collectives`` rows (rank, step, state, completed_ns).
        sections: window of ``sections`` rows (rank, step, end_ns).
        inflight: latest ``inflight`` row per rank (rank, ts_ns, kind, since_ns).
        heartbeats: latest heartbeat per rank (rank, alive[, caught_up][, acked_through_ns]).
        last_step: newest step any rank completed (-1: none).
        first_step: first step of this attempt (its warm-up step, excluded from history).
        hang_op_min_s: floor of the silence threshold.
        hang_k: multiple of the history's p99 gap.
        min_history_steps: complete steps after warm-up needed before judging.
        min_blocked_s: an op in flight this long at its record's time is one a rank waits in.
        gaps: per step, its longest job-wide completion gap (s), already reduced (by
            ClickHouse, :mod:`.rollups`) for the steps after warm-up up to ``last_step``;
            with ``quiet_since_ns`` (the newest completion) it replaces the raw frames.
        reference: judge the ranks one by one (:func:`_horizon_reference`), as the
            previous pass did; the same result.
    """
    if gaps is None or quiet_since_ns is None:
        events = completions(collectives, sections)
        quiet_since = int(events["t_ns"].max()) if not events.empty else 0
        hist = events[(events["step"] > first_step) & (events["step"] <= last_step)]
        gaps = step_gaps(hist)
    else:
        quiet_since = int(quiet_since_ns)
        gaps = gaps[(gaps.index > first_step) & (gaps.index <= last_step)]
    history_gap = float(np.percentile(gaps.to_numpy(), 99)) if len(gaps) else 0.0
    threshold = max(hang_op_min_s, hang_k * history_gap)
    horizon, unknown = (_horizon_reference if reference else _horizon)(ranks, inflight, heartbeats)
    blocked = _blocked(inflight, min_blocked_s)
    quiet = (horizon - quiet_since) / 1e9 if horizon and quiet_since else 0.0
    reason = ""
    if len(gaps) < min_history_steps:
        reason = f"{len(gaps)} step(s) of history after warm-up"
    elif unknown:
        reason = f"no in-flight record from rank(s) {unknown[:8]}"
    elif not quiet_since:
        reason = "no completion seen"
    armed = not reason
    return ProgressStall(armed, armed and quiet >= threshold and bool(blocked), quiet_since, horizon,
                         max(quiet, 0.0), threshold, history_gap, len(gaps), blocked, reason)


def _horizon(ranks: list[int], inflight: pd.DataFrame | None,
             heartbeats: pd.DataFrame | None) -> tuple[int, list[int]]:
    """``min`` over live ranks of their latest in-flight time, and the ranks with none
    (:func:`_horizon_reference` over arrays)."""
    want = np.asarray(ranks, dtype=np.int64)
    latest = pd.Series(dtype="int64")
    if inflight is not None and not inflight.empty:
        latest = inflight.groupby("rank")["ts_ns"].max()
    gone = _gone(heartbeats)
    live = want[~np.isin(want, gone)] if gone.size else want
    t = latest.reindex(live)
    have = t.notna().to_numpy()
    if not have.all() or not live.size:
        return 0, live[~have].tolist()
    h = t.to_numpy().astype(np.int64)
    acked = _acked_through(heartbeats)
    if not acked.empty:  # a rank whose agent says nothing keeps its stored time
        h = np.minimum(h, acked.reindex(live, fill_value=np.iinfo(np.int64).max).to_numpy(dtype=np.int64))
    return int(h.min()) - CERTIFY_MARGIN_NS, []


def _acked_through(heartbeats: pd.DataFrame | None) -> pd.Series:
    """Per rank whose agent says it (``-1``: it does not), the newest in-flight time up to
    which the store holds every record of the rank (the maximum over its heartbeats: each
    one was true when it was sent, whatever order they arrive in)."""
    if heartbeats is None or heartbeats.empty or "acked_through_ns" not in heartbeats:
        return pd.Series(dtype="int64")
    hb = heartbeats[(heartbeats["rank"] >= 0) & (heartbeats["acked_through_ns"] != -1)]
    return hb.groupby("rank")["acked_through_ns"].max().astype("int64")


def _gone(heartbeats: pd.DataFrame | None) -> np.ndarray:
    """Ranks whose latest heartbeat says their process is gone (and whose records the
    store holds)."""
    if heartbeats is None or heartbeats.empty or "alive" not in heartbeats:
        return np.zeros(0, dtype=np.int64)
    hb = heartbeats[heartbeats["rank"] >= 0].sort_values("ts_ns").groupby("rank").tail(1)
    dead = hb["alive"].astype(int) == 0
    if "caught_up" in hb:  # its last records may still be on the way
        dead &= hb["caught_up"].astype(int) == 1
    return hb.loc[dead, "rank"].to_numpy().astype(np.int64)


def _horizon_reference(ranks: list[int], inflight: pd.DataFrame | None,
                       heartbeats: pd.DataFrame | None) -> tuple[int, list[int]]:
    """:func:`_horizon` rank by rank (the definition; the previous pass used it)."""
    latest: dict[int, int] = {}
    if inflight is not None and not inflight.empty:
        latest = {int(r): int(t) for r, t in inflight.groupby("rank")["ts_ns"].max().items()}
    gone: set[int] = set()
    if heartbeats is not None and not heartbeats.empty and "alive" in heartbeats:
        hb = heartbeats[heartbeats["rank"] >= 0].sort_values("ts_ns").groupby("rank").tail(1)
        dead = hb["alive"].astype(int) == 0
        if "caught_up" in hb:  # its last records may still be on the way
            dead &= hb["caught_up"].astype(int) == 1
        gone = {int(r) for r in hb.loc[dead, "rank"]}
    live = [r for r in ranks if r not in gone]
    unknown = [r for r in live if r not in latest]
    if unknown or not live:
        return 0, unknown
    acked: dict[int, int] = {}
    if heartbeats is not None and not heartbeats.empty and "acked_through_ns" in heartbeats:
        for r, a in heartbeats[["rank", "acked_through_ns"]].itertuples(index=False):
            if r >= 0 and a != -1:
                acked[int(r)] = max(acked.get(int(r), int(a)), int(a))
    return min(min(latest[r], acked.get(r, latest[r])) for r in live) - CERTIFY_MARGIN_NS, []


def _blocked(inflight: pd.DataFrame | None, min_blocked_s: float) -> tuple[int, ...]:
    """Ranks whose latest in-flight record is a collective/p2p op held ``min_blocked_s``."""
    if inflight is None or inflight.empty:
        return ()
    d = inflight[inflight["rank"] >= 0].sort_values("ts_ns").groupby("rank").tail(1)
    held = d["kind"].isin(PROGRESS_OPS_KINDS) & (d["ts_ns"] - d["since_ns"] >= min_blocked_s * 1e9)
    return tuple(sorted(int(r) for r in d.loc[held, "rank"]))
