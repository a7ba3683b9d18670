"""ClickHouse SQL that loads the frames the detectors take (the only I/O of diagnosis).

Every query is parameterised (``{name:Type}``) and bounded: a window of the latest
steps of one job attempt, the latest in-flight/heartbeat row per rank, recent hardware
signals of the job's hosts.

:func:`load_reduced_frames` is what the diagnosis loop and the RCA routes use: the
window's raw events stay in ClickHouse, which reduces them per rank and step
(:mod:`.rollups`). :func:`load_job_frames` (raw sections and collectives of the window
into pandas) remains for the pure detector tests and as the reference the reduced path
is checked against.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from fleetscope.server.store.ddl import (
    HEARTBEATS_LATEST_TABLE,
    HEARTBEATS_NEWEST,
    INFLIGHT_LATEST_FIELDS,
    INFLIGHT_NEWEST_ROWS,
    PROGRESS_NEWEST,
    inflight_field,
)

from . import rollups

LAST_STEP = """
SELECT max(step) AS last_step, min(step) AS first_step, count() AS n FROM steps
WHERE job = {job:String} AND attempt = {attempt:Int32}
"""

STEPS = """
SELECT rank, any(host) AS host, step, min(start_ns) AS start_ns_, max(end_ns) AS end_ns_,
       max(duration_ns) AS duration_ns_
FROM steps
WHERE job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64}
GROUP BY rank, step
"""

STEP_TIMES = """
SELECT step, max(duration_ns) AS duration_ns_, max(end_ns) AS end_ns_
FROM steps
WHERE job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64}
GROUP BY step
"""

SECTIONS = """
SELECT rank, step, microbatch, name, kind, start_ns, end_ns, duration_ns, cpu_ns
FROM sections
WHERE job = {job:String} AND attempt = {attempt:Int32}
  AND step >= {from_step:Int64} AND step <= {to_step:Int64}
LIMIT 1 BY rank, step, microbatch, name, start_ns
"""

COLLECTIVES = """
SELECT rank, step, microbatch, group_id, axis, seq, op, bytes, dtype, peer, state,
       enqueued_ns, completed_ns
FROM collectives
WHERE job = {job:String} AND attempt = {attempt:Int32}
  AND step >= {from_step:Int64} AND step <= {to_step:Int64}
LIMIT 1 BY rank, group_id, seq, op, peer
"""

PROGRESS = """
SELECT rank, group_id, max(seq) AS last_seq
FROM collectives
WHERE job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64}
  AND state = 'completed'
GROUP BY rank, group_id
"""

FAILED_OPS = """
SELECT rank, min(completed_ns) AS failed_ns
FROM collectives
WHERE job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64}
  AND state = 'failed'
GROUP BY rank
"""
"""Each rank's first failed op (an error raised by the communication layer: a peer
vanished) in the latest steps. Run only once every rank of the job is dead: which ranks
died with an op failing under them (victims) and which without (the first to go)."""

INFLIGHT_LATEST = """
SELECT rank, max(ts_ns) AS last_ts, argMax(step, ts_ns) AS cur_step, argMax(kind, ts_ns) AS cur_kind,
       argMax(op, ts_ns) AS cur_op, argMax(group_id, ts_ns) AS cur_group_id,
       argMax(axis, ts_ns) AS cur_axis, argMax(seq, ts_ns) AS cur_seq, argMax(peer, ts_ns) AS cur_peer,
       argMax(since_ns, ts_ns) AS cur_since_ns
FROM inflight
WHERE job = {job:String} AND attempt = {attempt:Int32} AND ts_ns >= {since_ns:Int64}
GROUP BY rank
"""

INFLIGHT_NEWEST = f"""
SELECT rank, last_ts, {", ".join(f"{inflight_field(n)} AS cur_{n}" for n in INFLIGHT_LATEST_FIELDS)}
FROM ({INFLIGHT_NEWEST_ROWS})
WHERE last_ts >= {{since_ns:Int64}}
"""
""":data:`INFLIGHT_LATEST` from ``inflight_latest``, the newest row per rank kept at insert
time (schema version 3): it reads a few rows per rank (one per part not yet merged)
however long the job has run, where :data:`INFLIGHT_LATEST` reads every in-flight row of
the job's day (two a second per rank; the lookback filters them after the read: the
table's key is (job, rank, ts_ns)). A rank with two rows at its newest time gets one of
them, as ``argMax`` did."""

HEARTBEATS_LATEST = """
SELECT rank, host, max(ts_ns) AS last_ts, argMax(alive, ts_ns) AS cur_alive, argMax(pid, ts_ns) AS cur_pid,
       minIf(ts_ns, alive = 0) AS dead_since_ns, max(last_step) AS spool_last_step,
       ifNull(maxIfOrNull(acked_through_ns, acked_through_ns != -1), -1) AS acked_through_ns
FROM heartbeats
WHERE ts_ns >= {since_ns:Int64}
  AND (job = {job:String} OR (rank = -1 AND has({hosts:Array(String)}, host)))
GROUP BY rank, host
"""

HEARTBEAT_COLUMNS = ["rank", "host", "ts_ns", "alive", "pid", "dead_since_ns", "spool_last_step",
                     "acked_through_ns"]
"""The columns of :data:`HEARTBEATS_LATEST` (what an empty answer has)."""

LAST_SEEN = """
SELECT rank, max(t) AS last_seen_ns FROM (
  SELECT rank, max(end_ns) AS t FROM sections
  WHERE job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64} GROUP BY rank
  UNION ALL
  SELECT rank, max(completed_ns) AS t FROM collectives
  WHERE job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64}
    AND state = 'completed' GROUP BY rank
  UNION ALL
  SELECT rank, max(ts_ns) AS t FROM inflight
  WHERE job = {job:String} AND attempt = {attempt:Int32} AND ts_ns >= {since_ns:Int64} GROUP BY rank
) GROUP BY rank
"""

STEPS_LATEST = """
SELECT rank, argMax(host, step) AS host, max(step) AS step_, max(start_ns) AS start_ns_,
       max(end_ns) AS end_ns_, argMax(duration_ns, step) AS duration_ns_
FROM steps
WHERE job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64}
GROUP BY rank
"""

HOSTS_LAST = """
SELECT host, max(ts_ns) AS last_ns FROM heartbeats
WHERE ts_ns >= {since_ns:Int64} AND has({hosts:Array(String)}, host)
GROUP BY host
"""

LOG_EVENTS = """
SELECT ts_ns, host, rank, kind, severity, message FROM log_events
WHERE ts_ns >= {since_ns:Int64} AND (job = {job:String} OR has({hosts:Array(String)}, host))
ORDER BY ts_ns DESC LIMIT 500
"""

HW_METRICS = """
SELECT ts_ns, host, rank, device, name, value FROM metrics
WHERE ts_ns >= {since_ns:Int64} AND has({hosts:Array(String)}, host)
  AND multiSearchAny(lower(name), ['xid', 'ecc', 'throttle', 'carrier', 'flap', 'link_down', 'retired', 'remapped', 'nic.up'])
ORDER BY ts_ns DESC LIMIT 5000
"""

HOSTS_LAST_NEWEST = f"""
SELECT host, max(ts_ns) AS last_ns FROM `{HEARTBEATS_LATEST_TABLE}`
WHERE host IN {{hosts:Array(String)}}
GROUP BY host HAVING last_ns >= {{since_ns:Int64}}
"""
""":data:`HOSTS_LAST` from ``heartbeats_latest`` (a few rows per rank process, not every
heartbeat of the lookback)."""
""":data:`HOSTS_LAST` with the host list as a set: ``has(array, host)`` compares every row
with every host (6 s at 1,536 hosts); ``IN`` hashes them and uses the ``(host, ts_ns)``
key (0.03 s)."""

HW_METRICS_IN = HW_METRICS.replace("has({hosts:Array(String)}, host)", "host IN {hosts:Array(String)}")
""":data:`HW_METRICS` with the host set (2.4 s -> 0.05 s at 1,536 hosts)."""

LATEST_ATTEMPT = """
SELECT max(attempt) AS attempt, count() AS n FROM jobs WHERE job = {job:String}
"""

ATTEMPT_LAST_STEP = """
WITH ifNull((SELECT max(attempt) FROM jobs WHERE job = {job:String}), 0) AS att
SELECT att AS latest_attempt, s.last_step AS last_step, s.first_step AS first_step, s.n AS n FROM (
  SELECT max(step) AS last_step, min(step) AS first_step, count() AS n FROM steps
  WHERE job = {job:String} AND attempt = att
) AS s
"""
""":data:`LATEST_ATTEMPT` and :data:`LAST_STEP` in one query (0 when the job has no record)."""

RECENT = """
SELECT 0 AS src, rank, toString(group_id) AS group_id, toInt64(max(seq)) AS last_seq,
       toInt64(max(completed_ns)) AS t
FROM collectives
WHERE job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64} AND state = 'completed'
GROUP BY rank, group_id
UNION ALL
SELECT 1 AS src, rank, '' AS group_id, toInt64(-1) AS last_seq, toInt64(max(end_ns)) AS t FROM sections
WHERE job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64} GROUP BY rank
UNION ALL
SELECT 2 AS src, rank, '' AS group_id, toInt64(-1) AS last_seq, toInt64(max(ts_ns)) AS t FROM inflight
WHERE job = {job:String} AND attempt = {attempt:Int32} AND ts_ns >= {since_ns:Int64} GROUP BY rank
"""
""":data:`PROGRESS`, :data:`LAST_SEEN` and :data:`.rollups.QUIET_SINCE_SQL` of the recent
steps in one query, each raw table scanned once: per ``(rank, group_id)`` the newest
completed sequence and completion time (``src`` 0), per rank the newest section end (1)
and in-flight sample (2)."""

RECENT_WORK = """
SELECT 0 AS src, rank, toString(g) AS group_id, toInt64(ms) AS last_seq, toInt64(mc) AS t FROM (
  SELECT rank, group_id AS g, max(seq) AS ms, max(completed_ns) AS mc FROM collectives
  WHERE job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64} AND state = 'completed'
  GROUP BY rank, g)
UNION ALL
SELECT 1 AS src, rank, '' AS group_id, toInt64(-1) AS last_seq, toInt64(max(end_ns)) AS t FROM sections
WHERE job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64} GROUP BY rank
"""
""":data:`RECENT` without its in-flight part (``src`` 2): the pass reads each rank's newest
in-flight record anyway (:data:`INFLIGHT_NEWEST`, the same rows), whose time is that
part's answer. The collectives are grouped by the stored ``group_id`` (low cardinality),
not by its ``toString`` alias, which hashed every row's string."""


_FAST = threading.local()


def fast_enabled() -> bool:
    """The pass's cost cuts are on (default); off only inside :func:`fast_pass` (False),
    which the benchmark and the equivalence tests use to run the previous pass."""
    return getattr(_FAST, "on", True)


@contextlib.contextmanager
def fast_pass(on: bool) -> Iterator[None]:
    """Run the enclosed passes (this thread) with the cost cuts on or off."""
    prev = fast_enabled()
    _FAST.on = on
    try:
        yield
    finally:
        _FAST.on = prev


@dataclass
class JobFrames:
    """Everything one diagnosis pass needs for one job attempt."""

    attempt: int
    last_step: int
    steps: pd.DataFrame
    sections: pd.DataFrame
    collectives: pd.DataFrame
    step_times: pd.DataFrame
    inflight: pd.DataFrame
    heartbeats: pd.DataFrame
    progress: pd.DataFrame
    last_seen: dict[int, int]
    log_events: pd.DataFrame
    metrics: pd.DataFrame
    first_step: int = 0
    """First step of this attempt (its warm-up step)."""
    host_seen_ns: dict[str, int] = field(default_factory=dict)
    """Host -> server time of the latest batch its agent delivered (filled by the server's
    diagnosis loop; empty after a restart until the agents send again)."""
    job_seen_ns: int = 0
    """When the server last received a batch holding this job's rows (0: unknown)."""
    reduced: rollups.Reduced | None = None
    """The window reduced by ClickHouse (:func:`load_reduced_frames`); then ``sections`` and
    ``collectives`` are empty and ``steps`` holds one row per rank (its newest step)."""
    host_last_ns: dict[str, int] = field(default_factory=dict)
    """Host -> newest heartbeat time stored from its agent (any job)."""
    failed_ops: dict[int, int] = field(default_factory=dict)
    """Rank -> time of its first failed op in the latest steps; read only once every rank
    is dead (:data:`FAILED_OPS`), empty otherwise."""

    @property
    def hosts(self) -> dict[int, str]:
        """Rank -> host, from step markers (falling back to heartbeats)."""
        key = (id(self.heartbeats), len(self.heartbeats), id(self.steps), len(self.steps))
        memo = self.__dict__.get("_hosts_memo")
        if memo is not None and memo[0] == key:  # O(ranks), but asked several times a pass
            return dict(memo[1])
        out: dict[int, str] = {}
        for df in (self.heartbeats, self.steps):
            if not df.empty:
                d = df[df["rank"] >= 0][["rank", "host"]].drop_duplicates("rank")
                h = d["host"].to_numpy(dtype=object)
                keep = _TRUTHY(h).astype(bool) if len(h) else np.zeros(0, dtype=bool)  # ``if h`` per row
                out.update(zip(d["rank"].to_numpy().astype(np.int64)[keep].tolist(), _STR(h[keep]).tolist()))
        self.__dict__["_hosts_memo"] = (key, out)
        return dict(out)


_TRUTHY = np.frompyfunc(bool, 1, 1)
_STR = np.frompyfunc(str, 1, 1)


def rank_max(df: pd.DataFrame, col: str, how: str = "max") -> dict[int, int]:
    """Rank -> the largest (``how="min"``: smallest) ``col`` of its rows, as plain ints
    (one dict from two lists)."""
    if df.empty:
        return {}
    m = df.groupby("rank")[col].agg(how)
    return dict(zip(m.index.to_numpy().astype(np.int64).tolist(), m.to_numpy().astype(np.int64).tolist()))


def named_queries() -> dict[str, str]:
    """Every query a diagnosis pass runs, by name: a worker that reaches the store through
    the server (embedded chdb, owned by the server process) sends the name and the
    parameters, never SQL text (``POST /api/v1/internal/diagnosis/query``)."""
    mine = {"latest_attempt": LATEST_ATTEMPT, "last_step": LAST_STEP, "steps": STEPS,
            "steps_latest": STEPS_LATEST, "step_times": STEP_TIMES, "sections": SECTIONS,
            "collectives": COLLECTIVES, "progress": PROGRESS, "inflight_latest": INFLIGHT_LATEST,
            "heartbeats_latest": HEARTBEATS_LATEST, "heartbeats_newest": HEARTBEATS_NEWEST, "last_seen": LAST_SEEN, "log_events": LOG_EVENTS,
            "hw_metrics": HW_METRICS, "hosts_last": HOSTS_LAST,
            "attempt_last_step": ATTEMPT_LAST_STEP, "recent": RECENT, "hosts_last_newest": HOSTS_LAST_NEWEST,
            "hw_metrics_in": HW_METRICS_IN, "inflight_newest": INFLIGHT_NEWEST,
            "recent_work": RECENT_WORK, "progress_newest": PROGRESS_NEWEST, "failed_ops": FAILED_OPS}
    return {**mine, **{f"rollup_{k}": v for k, v in rollups.QUERIES.items()}}


def all_ranks_dead(heartbeats: pd.DataFrame, world_size: int) -> bool:
    """Every rank ``0..world_size-1`` has a heartbeat and its latest says its process is
    gone (O(ranks) over the latest-heartbeat frame)."""
    if heartbeats.empty or world_size <= 0 or "alive" not in heartbeats.columns:
        return False
    hb = heartbeats[heartbeats["rank"].between(0, world_size - 1)]
    latest = hb.sort_values("ts_ns").drop_duplicates("rank", keep="last")
    return len(latest) == world_size and not latest["alive"].astype(int).any()


def hardware_params(p: dict[str, Any], started_ns: int) -> dict[str, Any]:
    """Query parameters of the hardware reads (:data:`LOG_EVENTS`, :data:`HW_METRICS`):
    the lookback, but not before the job started. A host's GPU that throttled, or logged
    an Xid, before this job ran on it is the host's history (its host page and the fleet
    self-check keep it), not a fault of this job: back-to-back jobs on the same hosts
    would each inherit the previous one's hardware findings."""
    return {**p, "since_ns": max(int(p["since_ns"]), int(started_ns or 0))}


def latest_attempt(store: Any, job: str) -> int:
    rows = store.query_rows(LATEST_ATTEMPT, {"job": job})
    return int(rows[0]["attempt"]) if rows and rows[0]["n"] else 0


def load_job_frames(
    store: Any, job: str, now_ns: int, window_steps: int = 24, mfu_window_steps: int = 120,
    attempt: int | None = None, lookback_s: float = 600.0, hardware: bool = True,
    started_ns: int = 0,
) -> JobFrames:
    """Load a bounded window of one job's telemetry.

    Args:
        store: the ClickHouse store (``query_df``/``query_rows``).
        job: job id.
        now_ns: the server's current time.
        window_steps: steps of detailed events (sections/collectives) to load.
        mfu_window_steps: steps of per-step times for MFU and the stall threshold.
        attempt: job attempt; default the latest.
        lookback_s: how far back in-flight, heartbeat and hardware rows are read.
        hardware: read log events and hardware metrics (a hang-only pass skips them).
        started_ns: when the job started (the control plane's ``start_ns``): hardware
            events of its hosts from before it are not the job's (see :func:`hardware_params`).
    """
    att = latest_attempt(store, job) if attempt is None else attempt
    p: dict[str, Any] = {"job": job, "attempt": att}
    r = store.query_rows(LAST_STEP, p)
    last_step = int(r[0]["last_step"]) if r and r[0]["n"] else -1
    first_step = int(r[0]["first_step"]) if r and r[0]["n"] else 0
    from_step = max(last_step - window_steps + 1, 0)
    p.update(from_step=from_step, to_step=max(last_step, 0) + 1,
             since_ns=int(now_ns - lookback_s * 1e9))
    steps = _df(store, STEPS, p, ["rank", "host", "step", "start_ns", "end_ns", "duration_ns"])
    hosts = sorted({str(h) for h in steps["host"] if h}) if not steps.empty else []
    p["hosts"] = hosts
    frames = JobFrames(
        attempt=att,
        last_step=last_step,
        steps=steps,
        sections=_df(store, SECTIONS, p),
        collectives=_df(store, COLLECTIVES, p),
        step_times=_df(store, STEP_TIMES, {**p, "from_step": max(last_step - mfu_window_steps + 1, 0)},
                       ["step", "duration_ns", "end_ns"]),
        inflight=_df(store, INFLIGHT_LATEST, p),
        heartbeats=_df(store, HEARTBEATS_LATEST, p, HEARTBEAT_COLUMNS),
        progress=_df(store, PROGRESS, {**p, "from_step": max(last_step - 2, 0)}, ["rank", "group_id", "last_seq"]),
        last_seen={},
        log_events=_df(store, LOG_EVENTS, hardware_params(p, started_ns)) if hardware else pd.DataFrame(),
        metrics=(_df(store, HW_METRICS, hardware_params(p, started_ns)) if hosts and hardware
                 else pd.DataFrame()),
        first_step=first_step,
    )
    ls = _df(store, LAST_SEEN, p, ["rank", "last_seen_ns"])
    frames.last_seen = {int(a): int(b) for a, b in ls.itertuples(index=False)}
    _caught_up(frames.heartbeats, steps)  # minIf over no dead rows yields 0
    c, hb = frames.collectives, frames.heartbeats
    world = int(hb["rank"].max()) + 1 if not hb.empty else 0
    if not c.empty and "state" in c.columns and all_ranks_dead(hb, world):
        late = c[(c["state"] == "failed") & (c["step"] >= max(last_step - 2, 0))]
        frames.failed_ops = rank_max(late, "completed_ns", how="min")
    return frames


def load_reduced_frames(
    store: Any, job: str, now_ns: int, cache: rollups.StepCache, world_size: int, num_microbatches: int,
    window_steps: int = 24, mfu_window_steps: int = 120, attempt: int | None = None,
    lookback_s: float = 600.0, hardware: bool = True, hang_only: bool = False, started_ns: int = 0,
) -> JobFrames:
    """Like :func:`load_job_frames`, but every raw-event reduction runs in ClickHouse.

    Reads O(ranks) rows (latest step, in-flight record, heartbeat and progress per rank)
    plus, for a full pass, the per-rank-per-step reductions of the window's new or
    changed steps (:mod:`.rollups`, cached in ``cache``). A hang-only pass
    (``hang_only``) refreshes no per-rank-per-step reductions: it reuses the cached op
    gaps and reads the newest completion time. ``started_ns``: as in
    :func:`load_job_frames`.
    """
    fast = fast_enabled()
    if fast and attempt is None:  # one query instead of two
        r = store.query_rows(ATTEMPT_LAST_STEP, {"job": job})
        att = int(r[0]["latest_attempt"] or 0) if r else 0
    else:
        att = latest_attempt(store, job) if attempt is None else attempt
        r = store.query_rows(LAST_STEP, {"job": job, "attempt": att})
    p: dict[str, Any] = {"job": job, "attempt": att}
    last_step = int(r[0]["last_step"]) if r and r[0]["n"] else -1
    first_step = int(r[0]["first_step"]) if r and r[0]["n"] else 0
    from_step = max(last_step - window_steps + 1, 0)
    recent = max(last_step - 2, 0)
    p.update(from_step=from_step, to_step=max(last_step, 0) + 1, since_ns=int(now_ns - lookback_s * 1e9))
    inflight = _df(store, INFLIGHT_NEWEST if fast else INFLIGHT_LATEST, p)
    rec = _recent(store, {**p, "from_step": recent}, inflight) if fast else None
    steps = _df(store, STEPS_LATEST, p, ["rank", "host", "step", "start_ns", "end_ns", "duration_ns"])
    # (the distinct values first: one per host, not per rank)
    hosts = sorted({str(h) for h in pd.unique(steps["host"].to_numpy(dtype=object)) if h}) if not steps.empty else []
    p["hosts"] = hosts
    frames = JobFrames(
        attempt=att, last_step=last_step, steps=steps, sections=pd.DataFrame(), collectives=pd.DataFrame(),
        step_times=_df(store, STEP_TIMES, {**p, "from_step": max(last_step - mfu_window_steps + 1, 0)},
                       ["step", "duration_ns", "end_ns"]),
        inflight=inflight,
        heartbeats=_df(store, HEARTBEATS_NEWEST if fast else HEARTBEATS_LATEST, p, HEARTBEAT_COLUMNS),
        progress=(rec[0] if rec is not None else
                  _df(store, PROGRESS, {**p, "from_step": recent}, ["rank", "group_id", "last_seq"])),
        last_seen={},
        log_events=_df(store, LOG_EVENTS, hardware_params(p, started_ns)) if hardware else pd.DataFrame(),
        metrics=(_df(store, HW_METRICS_IN if fast else HW_METRICS, hardware_params(p, started_ns))
                 if hosts and hardware else pd.DataFrame()),
        first_step=first_step,
    )
    if rec is not None:
        frames.last_seen = rec[1]
    else:
        ls = _df(store, LAST_SEEN, {**p, "from_step": recent}, ["rank", "last_seen_ns"])
        frames.last_seen = {int(a): int(b) for a, b in ls.itertuples(index=False)}
    hl = store.query_rows(HOSTS_LAST_NEWEST if fast else HOSTS_LAST, p) if hosts else []
    frames.host_last_ns = {str(x["host"]): int(x["last_ns"]) for x in hl}
    _caught_up(frames.heartbeats, steps)
    if all_ranks_dead(frames.heartbeats, world_size):  # the job is gone: who went first?
        fo = _df(store, FAILED_OPS, {**p, "from_step": recent}, ["rank", "failed_ns"])
        frames.failed_ops = {int(a): int(b) for a, b in fo.itertuples(index=False)}
    if last_step >= 0:
        jc = cache.get(job, att, max(int(num_microbatches), 1))
        rollups.refresh(store, jc, job, from_step, last_step, first_step, gaps_only=hang_only, fast=fast)
        red = rollups.assemble(jc, world_size, from_step, last_step, fast=fast_enabled())
        if rec is not None:
            red.quiet_since_ns = rec[2]
        else:
            q = store.query_rows(rollups.QUIET_SINCE_SQL, {**p, "from_step": recent})
            red.quiet_since_ns = int(q[0]["t"] or 0) if q else 0
        frames.reduced = red
    return frames


def _recent(store: Any, p: dict[str, Any], inflight: pd.DataFrame,
            query: str = PROGRESS_NEWEST) -> tuple[pd.DataFrame, dict[int, int], int]:
    """Each rank's newest work (``query``: :data:`PROGRESS_NEWEST`, the rows kept at insert
    time, or the raw-row :data:`RECENT_WORK`, which answers the same) and the newest
    in-flight record per rank (``inflight``, read with the same job, attempt and lookback)
    as (the ``PROGRESS`` frame, ``LAST_SEEN`` rank -> time, the ``QUIET_SINCE`` time):
    what the three queries gave."""
    df = store.query_df(query, p)
    has_inf = inflight is not None and not inflight.empty
    if df is None or df.empty:
        if not has_inf:
            return pd.DataFrame(columns=["rank", "group_id", "last_seq"]), {}, 0
        src = rank = t = np.zeros(0, dtype="int64")
        progress = pd.DataFrame(columns=["rank", "group_id", "last_seq"])
    else:
        src = df["src"].to_numpy()
        rank = df["rank"].to_numpy().astype("int64")
        t = df["t"].to_numpy().astype("int64")
        coll = src == 0
        progress = pd.DataFrame({"rank": rank[coll], "group_id": df["group_id"].to_numpy(dtype=object)[coll],
                                 "last_seq": df["last_seq"].to_numpy().astype("int64")[coll]})
    if has_inf:  # (src 2 of RECENT)
        rank = np.concatenate([rank, inflight["rank"].to_numpy().astype("int64")])
        t = np.concatenate([t, inflight["ts_ns"].to_numpy().astype("int64")])
    seen = pd.Series(t).groupby(rank).max()
    work = t[:len(src)][src <= 1]
    return progress, dict(zip(seen.index.tolist(), seen.tolist())), int(work.max()) if work.size else 0


def _caught_up(hb: pd.DataFrame, steps: pd.DataFrame) -> None:
    """Heartbeat rows: ``dead_since_ns`` filled, ``caught_up`` = the store holds every step
    the rank's spool had (a rank's death is judged only then)."""
    if hb.empty:
        return
    hb["dead_since_ns"] = hb["dead_since_ns"].where(hb["dead_since_ns"] > 0, hb["ts_ns"])
    stored = steps.groupby("rank")["step"].max() if not steps.empty else pd.Series(dtype="int64")
    have = hb["rank"].map(stored).fillna(-1)
    hb["caught_up"] = (have >= hb["spool_last_step"]).astype(int)


def _df(store: Any, sql: str, params: dict[str, Any], columns: list[str] | None = None) -> pd.DataFrame:
    df = store.query_df(sql, params)
    if df is None or (df.empty and columns):
        return pd.DataFrame(columns=columns or [])
    df = df.rename(columns=lambda c: c[4:] if c.startswith("cur_") else c.replace("last_ts", "ts_ns").rstrip("_"))
    for c in df.columns:  # ClickHouse unsigned/nullable types -> plain numpy
        if str(df[c].dtype) in ("UInt8", "UInt16", "UInt32", "UInt64", "Int32", "Int64"):
            df[c] = df[c].astype("int64")
    return df
