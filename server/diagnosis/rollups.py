"""Per-rank-per-step reductions computed by ClickHouse, cached per step (incremental).

The detectors take per-rank-per-step arrays; the raw ``sections`` and ``collectives``
of a window (about 40 rows per rank per step, 10 M rows per 24-step window at 12,288
ranks) never leave the store. For a range of steps ClickHouse computes, with the same
arithmetic as :mod:`.breakdown` (window functions over each rank's ops and sections,
a join of every op to its ``(group_id, seq)`` arrival statistics, the k-th send matched
with the k-th receive, an ASOF join of ops into the top-level section they start in):

* :data:`RANK_STEP_SQL` - per ``(rank, step)``: the breakdown columns
  (:data:`.breakdown.BREAKDOWN_COLUMNS`), forward/backward own work per micro-batch
  (for the what-if profile), arrival counts, median lateness and how long peers
  waited for the rank in each group;
* :data:`GROUP_STEP_SQL` - per ``(group_id, axis, step)``: link time (completion - last
  arrival) as :func:`.breakdown.group_transfer` computes it and as the what-if profile
  sums it;
* :data:`STEP_GAPS_SQL` - per step: the longest job-wide gap between consecutive
  completions (the op-progress hang rule's history, :mod:`.progress`), exact from
  :data:`GAP_BUCKET_NS` (1 ms) up;
* :data:`MISMATCH_SQL` - the raw rows of the (rare) ``(group_id, seq)`` whose members
  disagree on op, size or dtype.

:class:`StepCache` keeps these per job and step. A pass asks ClickHouse only for the
steps whose raw row count in ``step_rollup`` (maintained at insert time by materialized
views) changed since they were computed, or that were incomplete then (the newest
completed step and the one in progress get only their op gaps and mismatch check; the
full reductions wait until the step is complete). So a steady-state pass reduces about
one step of raw events inside ClickHouse and moves O(ranks) rows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from fleetscope.server.diagnosis.breakdown import P2P_OP_QUANTILE
from fleetscope.server.store.ddl import ROLLUP_TABLE

_P2P = "('send', 'recv', 'isend', 'irecv')"
_RANGE = ("job = {job:String} AND attempt = {attempt:Int32} "
          "AND step >= {from_step:Int64} AND step <= {to_step:Int64}")

# Per-op arrivals of a step range: the arithmetic of breakdown.collective_arrivals.
_ARRIVALS = f"""
c AS MATERIALIZED (
  SELECT rank, step, microbatch, group_id, axis, seq, op, bytes, peer, enqueued_ns, completed_ns,
         greatest(completed_ns - enqueued_ns, 0) AS comm_ns, op IN {_P2P} AS p2p
  FROM collectives
  WHERE {_RANGE} AND state = 'completed' AND completed_ns >= 0
  LIMIT 1 BY rank, group_id, seq, op, peer
),
g AS (
  SELECT group_id, seq, max(enqueued_ns) AS last, count() AS n, min(completed_ns) AS first_done,
         quantileExactInclusive(0.5)(enqueued_ns) AS med,
         argMax(rank, enqueued_ns) AS last_rank
  FROM c WHERE NOT p2p GROUP BY group_id, seq
),
coll AS (
  SELECT c.rank AS rank, c.step AS step, c.group_id AS group_id, c.axis AS axis, c.seq AS seq,
         c.op AS op, c.bytes AS bytes, c.enqueued_ns AS enqueued_ns, c.comm_ns AS comm_ns,
         least(g.last - c.enqueued_ns, c.comm_ns) AS wait_ns,
         if(g.n > 1, toFloat64(c.enqueued_ns) - g.med, 0.) AS lateness_ns,
         c.rank = g.last_rank AND g.n > 1 AS is_last,
         greatest(g.first_done - g.last, 0) AS transfer_ns, g.last_rank AS waited_on_rank
  FROM c INNER JOIN g ON c.group_id = g.group_id AND c.seq = g.seq
  WHERE NOT c.p2p
),
pk AS (
  SELECT rank, step, group_id, axis, seq, op, bytes, peer, enqueued_ns, completed_ns, comm_ns,
         toUInt8(op IN ('send', 'isend')) AS is_send, if(is_send, rank, peer) AS src,
         if(is_send, peer, rank) AS dst,
         row_number() OVER (PARTITION BY step, src, dst, is_send ORDER BY enqueued_ns) AS k
  FROM c WHERE p2p
),
p2p AS (  -- the k-th send and the k-th receive of a (step, src, dst) share a window
  SELECT rank, step, group_id, axis, seq, op, bytes, enqueued_ns, comm_ns,
         if(n2 = 2, sum2 - enqueued_ns, enqueued_ns) AS other,
         greatest(enqueued_ns, other) AS last_arr,
         least(greatest(last_arr - enqueued_ns, 0), comm_ns) AS wait_ns,
         toFloat64(enqueued_ns - other) AS lateness_ns, enqueued_ns > other AS is_last,
         greatest(completed_ns - last_arr, 0) AS transfer_ns,
         if(is_last, rank, peer) AS waited_on_rank
  FROM (SELECT *, count() OVER w AS n2, sum(enqueued_ns) OVER w AS sum2 FROM pk
        WINDOW w AS (PARTITION BY step, src, dst, k))
),
arr AS MATERIALIZED (
  SELECT rank, step, group_id, axis, seq, op, bytes, enqueued_ns, comm_ns, wait_ns, lateness_ns,
         is_last, transfer_ns, waited_on_rank FROM coll
  UNION ALL
  SELECT rank, step, group_id, axis, seq, op, bytes, enqueued_ns, comm_ns, wait_ns, lateness_ns,
         is_last, transfer_ns, waited_on_rank FROM p2p
),
ex AS MATERIALIZED (  -- each op's communication not already covered by the rank's earlier ops
  SELECT rank, step, enqueued_ns, greatest(end_ - greatest(enqueued_ns, covered), 0) AS excl_ns FROM (
    SELECT rank, step, enqueued_ns, greatest(enqueued_ns + comm_ns, enqueued_ns) AS end_,
           max(end_) OVER (PARTITION BY rank ORDER BY enqueued_ns
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered
    FROM arr)
)"""

RANK_STEP_SQL = f"""
WITH {_ARRIVALS},
s0 AS (
  SELECT rank, step, microbatch, name, kind, start_ns, end_ns, duration_ns, cpu_ns FROM sections
  WHERE {_RANGE}
  LIMIT 1 BY rank, step, microbatch, name, start_ns
),
s1 AS (
  SELECT *, max(end_ns) OVER (PARTITION BY rank ORDER BY start_ns ASC, end_ns DESC
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end,
         row_number() OVER (PARTITION BY rank ORDER BY start_ns ASC, end_ns DESC) AS rn
  FROM s0
),
top AS (SELECT rank, step, microbatch, name, kind, start_ns, end_ns, duration_ns, cpu_ns FROM s1
        WHERE NOT (rn > 1 AND end_ns <= prev_end)),
nested AS (
  SELECT t.rank AS rank, t.start_ns AS start_ns, t.name AS name, t.microbatch AS microbatch,
         sum(o.excl_ns) AS nested_ns
  FROM ex AS o
  ASOF INNER JOIN top AS t ON o.rank = t.rank AND o.enqueued_ns >= t.start_ns
  WHERE o.enqueued_ns < t.end_ns
  GROUP BY rank, start_ns, name, microbatch
),
sec AS (
  SELECT t.rank AS rank, t.step AS step,
         sumIf(net, t.kind = 'compute') AS compute_ns, sumIf(net, t.kind = 'dataloader') AS dataloader_ns,
         sumIf(net, t.kind = 'optimizer') AS optimizer_ns, sumIf(net, t.kind = 'other') AS other_ns,
         sumIf(t.cpu_ns, t.kind = 'compute' AND t.cpu_ns >= 0) AS compute_cpu_ns,
         sumIf(t.cpu_ns, t.kind = 'optimizer' AND t.cpu_ns >= 0) AS optimizer_cpu_ns,
         sumMapIf([mb], [net], t.name = 'forward') AS fwd_, sumMapIf([mb], [net], t.name = 'backward') AS bwd_,
         fwd_.1 AS fwd_k, fwd_.2 AS fwd_v, bwd_.1 AS bwd_k, bwd_.2 AS bwd_v
  FROM (SELECT t.*, greatest(t.duration_ns - n.nested_ns, 0) AS net,
               toUInt16(greatest(t.microbatch, 0) % {{num_mb:UInt16}}) AS mb
        FROM top AS t LEFT JOIN nested AS n
          ON t.rank = n.rank AND t.start_ns = n.start_ns AND t.name = n.name AND t.microbatch = n.microbatch) AS t
  GROUP BY rank, step
),
ra AS (
  SELECT rank, step, sum(wait_ns) AS wait_ns, count() AS num_collectives,
         countIf(is_last) AS num_last_arrivals,
         quantileExactInclusive(0.5)(lateness_ns) AS lateness_med_ns
  FROM arr GROUP BY rank, step
),
rc AS (SELECT rank, step, sum(excl_ns) AS comm_ns FROM ex GROUP BY rank, step),
caused AS (
  SELECT waited_on_rank AS rank, step, sumIf(wait_ns, wait_ns > 0) AS wait_caused_ns,
         sumMap([toString(group_id)], [wait_ns]) AS cg_, cg_.1 AS caused_k, cg_.2 AS caused_v
  FROM arr WHERE NOT is_last GROUP BY rank, step
),
st AS (
  SELECT rank, step, max(duration_ns) AS step_ns, min(start_ns) AS start_ns FROM steps
  WHERE {_RANGE} GROUP BY rank, step
)
SELECT st.rank AS rank, st.step AS step, st.step_ns AS step_ns,
       rc.comm_ns AS comm_ns, ra.wait_ns AS wait_ns, ra.num_collectives AS num_collectives,
       ra.num_last_arrivals AS num_last_arrivals, ra.lateness_med_ns AS lateness_med_ns,
       caused.wait_caused_ns AS wait_caused_ns, caused.caused_k AS caused_k, caused.caused_v AS caused_v,
       sec.compute_ns AS compute_ns, sec.dataloader_ns AS dataloader_ns,
       sec.optimizer_ns AS optimizer_ns, sec.other_ns AS other_ns, sec.compute_cpu_ns AS compute_cpu_ns,
       sec.optimizer_cpu_ns AS optimizer_cpu_ns,
       sec.fwd_k AS fwd_k, sec.fwd_v AS fwd_v, sec.bwd_k AS bwd_k, sec.bwd_v AS bwd_v
FROM st
LEFT JOIN ra ON st.rank = ra.rank AND st.step = ra.step
LEFT JOIN rc ON st.rank = rc.rank AND st.step = rc.step
LEFT JOIN caused ON st.rank = caused.rank AND st.step = caused.step
LEFT JOIN sec ON st.rank = sec.rank AND st.step = sec.step
SETTINGS join_use_nulls = 0, enable_materialized_cte = 1
"""

GROUP_STEP_SQL = f"""
WITH {_ARRIVALS},
per_op AS (  -- breakdown.group_transfer: a collective op once per group, each p2p receive
  SELECT group_id, axis, step, seq, min(transfer_ns) AS t, max(bytes) AS b, 1 AS coll FROM arr
  WHERE op NOT IN {_P2P} GROUP BY group_id, axis, step, seq
  UNION ALL
  SELECT group_id, axis, step, seq, transfer_ns AS t, bytes AS b, 0 AS coll FROM arr WHERE op IN ('recv', 'irecv')
),
gt AS (  -- the typical op: the median, or a step of receives only's upper quartile
  SELECT group_id, axis, step, sum(t) AS gt_transfer_ns,
         if(max(coll) = 0, quantileExactInclusive({P2P_OP_QUANTILE})(t),
            quantileExactInclusive(0.5)(t)) AS op_transfer_ns,
         count() AS num_ops, sum(b) AS bytes
  FROM per_op GROUP BY group_id, axis, step
),
link AS (  -- whatif.profile_from_frames: min per (group, step, seq, op), sends left out
  SELECT group_id, axis, step, sum(t) AS transfer_ns FROM (
    SELECT group_id, axis, step, seq, op, min(transfer_ns) AS t FROM arr
    WHERE op NOT IN ('send', 'isend') GROUP BY group_id, axis, step, seq, op)
  GROUP BY group_id, axis, step
)
SELECT gt.group_id AS group_id, gt.axis AS axis, gt.step AS step, gt.gt_transfer_ns AS gt_transfer_ns,
       gt.op_transfer_ns AS op_transfer_ns, gt.num_ops AS num_ops, gt.bytes AS bytes,
       link.transfer_ns AS transfer_ns
FROM gt LEFT JOIN link ON gt.group_id = link.group_id AND gt.axis = link.axis AND gt.step = link.step
SETTINGS join_use_nulls = 0, enable_materialized_cte = 1
"""

def _parts(sql: str, select_start: str) -> tuple[str, str]:
    """(the CTEs after the arrivals, the final SELECT) of :data:`RANK_STEP_SQL` or
    :data:`GROUP_STEP_SQL`."""
    body = sql.split(f"WITH {_ARRIVALS},", 1)[1]
    i = body.index(select_start)
    return body[:i].rstrip().rstrip(","), body[i:body.index("\nSETTINGS")]


_RS_COLS = ("rank", "step", "step_ns", "comm_ns", "wait_ns", "num_collectives", "num_last_arrivals",
            "lateness_med_ns", "wait_caused_ns", "caused_k", "caused_v", "compute_ns", "dataloader_ns",
            "optimizer_ns", "other_ns", "compute_cpu_ns", "optimizer_cpu_ns", "fwd_k", "fwd_v", "bwd_k", "bwd_v")
_GS_COLS = ("group_id", "axis", "step", "gt_transfer_ns", "op_transfer_ns", "num_ops", "bytes", "transfer_ns")
_RS_DEFAULTS = {"lateness_med_ns": "0.", "caused_k": "[]", "caused_v": "[]", "fwd_k": "[]", "fwd_v": "[]",
                "bwd_k": "[]", "bwd_v": "[]"}
_GS_DEFAULTS = {"group_id": "''", "axis": "''", "op_transfer_ns": "0."}


def _rank_group_sql() -> str:
    rc, rsel = _parts(RANK_STEP_SQL, "SELECT st.rank AS rank")
    gc, gsel = _parts(GROUP_STEP_SQL, "SELECT gt.group_id AS group_id")
    cols = list(dict.fromkeys(_RS_COLS + _GS_COLS))
    a = ", ".join(c if c in _RS_COLS else f"{_GS_DEFAULTS.get(c, '0')} AS {c}" for c in cols)
    b = ", ".join(c if c in _GS_COLS else f"{_RS_DEFAULTS.get(c, '0')} AS {c}" for c in cols)
    return (f"WITH {_ARRIVALS},{rc},{gc},\nrs AS (\n{rsel}\n),\ngs AS (\n{gsel}\n)\n"
            f"SELECT 0 AS part, {a} FROM rs\nUNION ALL\nSELECT 1 AS part, {b} FROM gs\n"
            "SETTINGS join_use_nulls = 0, enable_materialized_cte = 1\n")


RANK_GROUP_STEP_SQL = _rank_group_sql()
""":data:`RANK_STEP_SQL` and :data:`GROUP_STEP_SQL` in one query (``part`` 0: rank rows, 1:
group rows): the op arrivals of the step range, the costliest part of both, are read,
joined and windowed once instead of twice."""


MB_COLS = ("fwd_k", "fwd_v", "bwd_k", "bwd_v")
"""The rank rows' per-micro-batch own-work arrays: read only to build the (ranks, micro-
batches) matrices, never as frame columns by the detectors."""


def split_rank_group_arrow(tbl: pa.Table) -> tuple[pd.DataFrame, pd.DataFrame, pa.Table]:
    """:data:`RANK_GROUP_STEP_SQL`'s rows, read as Arrow, as (the rank-step frame without
    the :data:`MB_COLS` arrays, the group-step frame, the rank rows' ``rank``, ``step``
    and :data:`MB_COLS` as Arrow). The arrays stay Arrow lists, for
    :func:`step_matrices_arrow`: no Python object per rank and step (at 12,288 ranks the
    pandas route made ~50,000 small arrays a step and then walked them)."""
    rs_cols = [c for c in _RS_COLS if c not in MB_COLS]
    if tbl.num_rows == 0:
        return (pd.DataFrame(columns=rs_cols), pd.DataFrame(columns=list(_GS_COLS)),
                pa.table({c: pa.array([], pa.int64()) for c in ("rank", "step")}))
    part = tbl.column("part")
    rt = tbl.filter(pc.equal(part, 0))
    gt = tbl.filter(pc.equal(part, 1))
    return (rt.select(rs_cols).to_pandas(), gt.select(list(_GS_COLS)).to_pandas(),
            rt.select(["rank", "step", *MB_COLS]))


GAP_BUCKET_NS = 1_000_000
"""Resolution of :data:`STEP_GAPS_SQL`: gaps of at least this are exact; a step whose
longest gap is shorter may read up to this much less (the hang rule's thresholds are
seconds)."""

STEP_GAPS_SQL = f"""
SELECT step, max(gap) / 1e9 AS gap_s FROM (
  -- Completions are bucketed by time; the gap before each bucket's first completion is
  -- exact (its min time minus the previous bucket's max) and is that completion's step's;
  -- the gaps inside a bucket are shorter than a bucket and count as 0. A hash aggregation
  -- into ~1,000 buckets a second instead of sorting every completion. Every step seen
  -- gets a row (gap 0 at least): the hang rule counts the steps of history.
  SELECT arrayJoin(arrayConcat([(opener, t0 - lagInFrame(t1, 1, t0) OVER (ORDER BY b ASC
                                  ROWS BETWEEN 1 PRECEDING AND CURRENT ROW))],
                               arrayMap(x -> (x, 0), seen))) AS p, p.1 AS step, p.2 AS gap
  FROM (
    SELECT intDiv(t, {GAP_BUCKET_NS}) AS b, argMin(step, t) AS opener, min(t) AS t0, max(t) AS t1,
           groupUniqArray(step) AS seen
    FROM (
      SELECT step, completed_ns AS t FROM collectives
      WHERE job = {{job:String}} AND attempt = {{attempt:Int32}}
        AND step >= {{ctx_step:Int64}} AND step <= {{to_step:Int64}} AND state = 'completed'
      UNION ALL
      SELECT step, end_ns AS t FROM sections
      WHERE job = {{job:String}} AND attempt = {{attempt:Int32}}
        AND step >= {{ctx_step:Int64}} AND step <= {{to_step:Int64}}
    ) WHERE t > 0 AND step > {{first_step:Int64}}
    GROUP BY b
  )
)
WHERE step >= {{from_step:Int64}}
GROUP BY step
"""

QUIET_SINCE_SQL = """
SELECT max(t) AS t FROM (
  SELECT max(completed_ns) AS t FROM collectives
  WHERE job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64}
    AND state = 'completed'
  UNION ALL
  SELECT max(end_ns) AS t FROM sections
  WHERE job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64}
)
"""

MISMATCH_SQL = f"""
WITH bad AS (
  SELECT group_id, seq FROM collectives
  WHERE {_RANGE} AND op NOT IN {_P2P}
  GROUP BY group_id, seq
  HAVING min(op) != max(op) OR min(bytes) != max(bytes) OR min(dtype) != max(dtype)
  LIMIT 16
)
SELECT rank, step, group_id, seq, op, bytes, dtype FROM collectives
WHERE {_RANGE} AND (group_id, seq) IN (SELECT group_id, seq FROM bad)
LIMIT 1 BY rank, group_id, seq, op
"""

STEP_COUNTS_SQL = f"""
SELECT step, sum(num_collectives) + sum(num_sections) AS n_raw, max(step_ns) > 0 AS has_marker
FROM {ROLLUP_TABLE}
WHERE {_RANGE}
GROUP BY step
"""

QUERIES: dict[str, str] = {
    "rank_step": RANK_STEP_SQL, "group_step": GROUP_STEP_SQL, "step_gaps": STEP_GAPS_SQL,
    "quiet_since": QUIET_SINCE_SQL, "mismatch": MISMATCH_SQL, "step_counts": STEP_COUNTS_SQL,
    "rank_group_step": RANK_GROUP_STEP_SQL,
}
"""Named diagnosis queries (a remote worker sends the name, never SQL text)."""

INT_COLS = ("step_ns", "comm_ns", "wait_ns", "num_collectives", "num_last_arrivals", "wait_caused_ns",
            "compute_ns", "dataloader_ns", "optimizer_ns", "other_ns", "compute_cpu_ns", "optimizer_cpu_ns")


@dataclass
class StepData:
    """The reductions of one step of one job attempt."""

    n_raw: int
    rank_step: pd.DataFrame
    group_step: pd.DataFrame
    gap_s: float | None
    mismatch: pd.DataFrame
    mb: dict[str, np.ndarray] | None = None
    """``fwd``/``bwd`` -> the step's (world_size, num_mb) own-work matrix, made once when
    the step is reduced (None: made by :func:`assemble` on every pass, the old way)."""
    mb_arrays: pa.Table | None = None
    """The step's rank rows' :data:`MB_COLS` as Arrow (the fast pass), which ``mb`` is made
    from; None: ``rank_step`` holds them as columns (the previous pass)."""


@dataclass
class JobCache:
    attempt: int
    num_mb: int
    steps: dict[int, StepData] = field(default_factory=dict)


class StepCache:
    """Per job: the reductions of the steps of its window, bounded to ``max_jobs`` jobs (LRU)."""

    def __init__(self, max_jobs: int = 16) -> None:
        self.max_jobs = max_jobs
        self._jobs: OrderedDict[str, JobCache] = OrderedDict()
        self._lock = threading.Lock()
        self.steps_computed = 0
        self.steps_reused = 0

    def get(self, job: str, attempt: int, num_mb: int) -> JobCache:
        with self._lock:
            jc = self._jobs.get(job)
            if jc is None or jc.attempt != attempt or jc.num_mb != num_mb:
                jc = JobCache(attempt, num_mb)
                self._jobs[job] = jc
            self._jobs.move_to_end(job)
            while len(self._jobs) > self.max_jobs:
                self._jobs.popitem(last=False)
            return jc

    def drop(self, job: str) -> None:
        with self._lock:
            self._jobs.pop(job, None)

    def nbytes(self) -> int:
        """Approximate memory held (the frames' numeric columns)."""
        with self._lock:
            jobs = list(self._jobs.values())
        return sum(int(d.rank_step.memory_usage(deep=False).sum() + d.group_step.memory_usage(deep=False).sum()
                       + (d.mb_arrays.nbytes if d.mb_arrays is not None else 0))
                   for jc in jobs for d in list(jc.steps.values()))


def _ranges(steps: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of sorted steps as (first, last)."""
    out: list[tuple[int, int]] = []
    for s in steps:
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _fix(df: pd.DataFrame) -> pd.DataFrame:
    for c in df.columns:
        if c in INT_COLS or c in ("rank", "step", "num_ops", "bytes", "seq"):
            df[c] = pd.to_numeric(df[c], errors="coerce").fillna(0).astype("int64")
    return df


def refresh(store: Any, cache: JobCache, job: str, from_step: int, last_step: int, first_step: int,
            gaps_only: bool = False, fast: bool = True) -> dict[str, int]:
    """Bring ``cache`` up to date for steps ``from_step .. last_step + 1``; drop older steps.

    ``gaps_only`` (the hang pass): only steps with no cached op gap get one (cheap);
    nothing else is recomputed. ``fast`` False: the rank and group reductions as two
    queries (the previous pass). Returns counts (steps computed, reused).
    """
    to_step = last_step + 1
    p = {"job": job, "attempt": cache.attempt, "from_step": from_step, "to_step": to_step}
    if gaps_only:
        missing = [s for s in range(from_step, last_step + 1)
                   if s > first_step and (s not in cache.steps or cache.steps[s].gap_s is None)]
        for lo, hi in _ranges(missing):
            ctx = lo - 1 if lo - 1 > first_step and lo > from_step else lo
            gaps = store.query_df(STEP_GAPS_SQL, {**p, "from_step": lo, "to_step": hi, "ctx_step": ctx,
                                                  "first_step": first_step})
            for st, v in zip(gaps["step"], gaps["gap_s"]) if not gaps.empty else ():
                have = cache.steps.get(int(st))
                if have is None:  # no reductions yet: n_raw -1 makes the next full pass compute it
                    cache.steps[int(st)] = StepData(-1, pd.DataFrame(), pd.DataFrame(), float(v), pd.DataFrame())
                else:
                    have.gap_s = float(v)
        return {"computed": 0, "reused": 0, "gaps": len(missing)}
    counts = store.query_df(STEP_COUNTS_SQL, p)
    n_raw = {int(s): int(n) for s, n in zip(counts["step"], counts["n_raw"])} if not counts.empty else {}
    for s in [s for s in cache.steps if s < from_step or s > to_step]:
        del cache.steps[s]
    # A step's reductions change only when rows of it arrive: recompute exactly those steps.
    # The detectors judge complete steps (< last_step); the newer ones need only their op
    # gaps (up to last_step) and mismatch check.
    todo = [s for s in range(from_step, to_step + 1)
            if s not in cache.steps or cache.steps[s].n_raw != n_raw.get(s, 0)]
    reused = (to_step - from_step + 1) - len(todo)
    for lo, hi in _ranges(todo):
        q = {**p, "from_step": lo, "to_step": hi, "num_mb": cache.num_mb}
        empty = pd.DataFrame()
        heavy_hi = min(hi, last_step - 1)
        rs = gs = empty
        mbt: pa.Table | None = None
        if heavy_hi >= lo:
            hq = {**q, "to_step": heavy_hi}
            if fast:
                rs, gs, mbt = split_rank_group_arrow(store.query_arrow(RANK_GROUP_STEP_SQL, hq))
                rs, gs = _fix(rs), _fix(gs)
            else:
                rs = _fix(store.query_df(RANK_STEP_SQL, hq))
                gs = _fix(store.query_df(GROUP_STEP_SQL, hq))
        gap: dict[int, float] = {}
        if min(hi, last_step) >= lo:
            ctx = lo - 1 if lo - 1 > first_step and lo > from_step else lo
            gaps = store.query_df(STEP_GAPS_SQL, {**q, "ctx_step": ctx, "to_step": min(hi, last_step),
                                                  "first_step": first_step})
            gap = {int(s): float(v) for s, v in zip(gaps["step"], gaps["gap_s"])} if not gaps.empty else {}
        mm = store.query_df(MISMATCH_SQL, q)
        for s in range(lo, hi + 1):
            cache.steps[s] = StepData(
                # an incomplete step (>= last_step) is recomputed once it is complete
                n_raw.get(s, 0) if s <= heavy_hi else -1,
                rs[rs["step"] == s].reset_index(drop=True) if not rs.empty else rs,
                gs[gs["step"] == s].reset_index(drop=True) if not gs.empty else gs,
                gap.get(s),
                mm[mm["step"] == s] if not mm.empty else mm,
                mb_arrays=None if mbt is None else mbt.filter(pc.equal(mbt.column("step"), s)),
            )
    return {"computed": len(todo), "reused": reused}


@dataclass
class Reduced:
    """What the detectors need from a window, reduced by ClickHouse."""

    breakdown: pd.DataFrame
    """Per (rank, step): :data:`.breakdown.BREAKDOWN_COLUMNS` plus ``lateness_med_ns``."""
    groups: pd.DataFrame
    """Per (group_id, axis, step): group_transfer and profile link columns."""
    gaps: pd.Series
    """Per step (after warm-up, up to the last complete step): longest job-wide gap (s)."""
    mismatch_rows: pd.DataFrame
    fwd: dict[int, np.ndarray] = field(default_factory=dict)
    """step -> (world_size, num_mb) forward own work (NaN where no section)."""
    bwd: dict[int, np.ndarray] = field(default_factory=dict)
    caused_by_group: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)
    """(rank, step) -> group -> time peers waited for the rank there."""
    quiet_since_ns: int = 0


def _mb_matrix(rows: pd.DataFrame, col: str, world: int, num_mb: int) -> np.ndarray:
    """(world, num_mb) matrix from the per-rank ``{col}_k`` / ``{col}_v`` array columns."""
    m = np.full((world, num_mb), np.nan)
    for r, ks, vs in zip(rows["rank"].to_numpy(), rows[f"{col}_k"], rows[f"{col}_v"]):
        if 0 <= r < world and ks is not None:
            for k, x in zip(ks, vs):
                if 0 <= int(k) < num_mb:
                    m[r, int(k)] = x
    return m


def _mb_matrix_np(rows: pd.DataFrame, col: str, world: int, num_mb: int) -> np.ndarray:
    """:func:`_mb_matrix` with numpy: one flatten of the array columns, one scatter."""
    m = np.full((world, num_mb), np.nan)
    if rows.empty:
        return m
    ks = rows[f"{col}_k"].to_numpy(dtype=object)
    vs = rows[f"{col}_v"].to_numpy(dtype=object)
    ranks = rows["rank"].to_numpy().astype(np.int64)
    n = np.fromiter((0 if k is None else len(k) for k in ks), dtype=np.int64, count=len(ks))
    ok = (ranks >= 0) & (ranks < world) & (n > 0)
    if not ok.any():
        return m
    kk = np.concatenate([np.asarray(k, dtype=np.float64) for k, o in zip(ks, ok) if o]).astype(np.int64)
    vv = np.concatenate([np.asarray(v, dtype=np.float64) for v, o in zip(vs, ok) if o])
    rr = np.repeat(ranks[ok], n[ok])
    keep = (kk >= 0) & (kk < num_mb)
    m[rr[keep], kk[keep]] = vv[keep]  # one row per rank and step: no index repeats
    return m


def _mb_matrix_arrow(arrays: pa.Table, col: str, world: int, num_mb: int) -> np.ndarray:
    """:func:`_mb_matrix_np` from Arrow list columns: the flattened keys and values and the
    list lengths, one scatter."""
    m = np.full((world, num_mb), np.nan)
    if arrays.num_rows == 0:
        return m
    ks, vs = arrays.column(f"{col}_k"), arrays.column(f"{col}_v")
    n = pc.fill_null(pc.list_value_length(ks), 0).to_numpy().astype(np.int64)
    kk = pc.list_flatten(ks).to_numpy().astype(np.int64)
    vv = pc.list_flatten(vs).to_numpy().astype(np.float64)
    rr = np.repeat(arrays.column("rank").to_numpy().astype(np.int64), n)
    keep = (rr >= 0) & (rr < world) & (kk >= 0) & (kk < num_mb)
    m[rr[keep], kk[keep]] = vv[keep]  # one row per rank and step: no index repeats
    return m


def step_matrices(rank_step: pd.DataFrame, world: int, num_mb: int) -> dict[str, np.ndarray]:
    """One step's forward/backward own-work matrices (what :func:`assemble` hands on)."""
    return {c: _mb_matrix_np(rank_step, c, world, num_mb) for c in ("fwd", "bwd")}


def step_matrices_arrow(arrays: pa.Table, world: int, num_mb: int) -> dict[str, np.ndarray]:
    """:func:`step_matrices` from a step's :attr:`StepData.mb_arrays`."""
    return {c: _mb_matrix_arrow(arrays, c, world, num_mb) for c in ("fwd", "bwd")}


def assemble(cache: JobCache, world: int, from_step: int, last_step: int, fast: bool = True) -> Reduced:
    """The window ``from_step .. last_step + 1`` from the cache as detector inputs (``fast``
    False: the per-step matrices are rebuilt in Python on every call, the old way)."""
    steps = [s for s in sorted(cache.steps) if from_step <= s <= last_step + 1]
    rs = [cache.steps[s].rank_step for s in steps if not cache.steps[s].rank_step.empty]
    gs = [cache.steps[s].group_step for s in steps if not cache.steps[s].group_step.empty]
    mm = [cache.steps[s].mismatch for s in steps if not cache.steps[s].mismatch.empty]
    bd = pd.concat(rs, ignore_index=True) if rs else pd.DataFrame()
    # the micro-batch arrays are the fwd/bwd matrices' input, not detector columns
    bd = bd.drop(columns=[c for c in MB_COLS if c in bd.columns])
    if not bd.empty:  # as breakdown.rank_step_breakdown: own work = step time - communication
        bd["busy_ns"] = (bd["step_ns"] - bd["comm_ns"]).clip(lower=0)
        timed = bd["compute_ns"] + bd["dataloader_ns"] + bd["optimizer_ns"] + bd["other_ns"]
        bd["untimed_ns"] = (bd["busy_ns"] - timed).clip(lower=0)
    out = Reduced(
        breakdown=bd,
        groups=pd.concat(gs, ignore_index=True) if gs else pd.DataFrame(),
        gaps=pd.Series({s: cache.steps[s].gap_s for s in steps
                        if s <= last_step and cache.steps[s].gap_s is not None}, dtype="float64"),
        mismatch_rows=pd.concat(mm, ignore_index=True) if mm else pd.DataFrame(),
    )
    for s in steps:
        d = cache.steps[s]
        r = d.rank_step
        if r.empty:
            continue
        if fast:  # made once per step and kept (a step's rows change only when it is reduced again)
            if d.mb is None or d.mb["fwd"].shape != (world, cache.num_mb):
                d.mb = (step_matrices_arrow(d.mb_arrays, world, cache.num_mb) if d.mb_arrays is not None
                        else step_matrices(r, world, cache.num_mb))
            out.fwd[s], out.bwd[s] = d.mb["fwd"], d.mb["bwd"]
            continue
        out.fwd[s] = _mb_matrix(r, "fwd", world, cache.num_mb)
        out.bwd[s] = _mb_matrix(r, "bwd", world, cache.num_mb)
    return out
