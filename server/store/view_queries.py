"""ClickHouse SQL behind the dashboard's views (heat-map, grid, trend, timeline,
trace export, hardware panel).

Every value is a ``{name:Type}`` parameter. The only text spliced into the SQL is a
metric expression or an aggregate function picked from the fixed dictionaries below by
a key the route has already validated, never a user string.

Per-rank-per-step figures come from ``step_rollup`` (partial aggregates until merged).
The whole-job queries read it with ``FINAL``, which merges the partial rows of each
``(job, attempt, step, rank)`` key while streaming in sort-key order: the same values as
grouping by ``(step, rank)`` again, about three times faster than a hash aggregation
over millions of keys (12,288 ranks x 200 steps). Only the timeline and the trace read
raw ``sections`` / ``collectives`` rows, always for a bounded rank set and step window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import pandas as pd

from fleetscope.topology import Topology

from .ddl import (
    HEARTBEATS_LATEST_TABLE,
    INFLIGHT_NEWEST_ROWS,
    ROLLUP_TABLE,
    comm_union_sql,
    inflight_field,
)


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    sql: str = ""
    """Expression over the per-(step, rank) rollup columns (rollup metrics)."""
    metric_names: tuple[str, ...] = ()
    """Names in the ``metrics`` table (device metrics), first one found wins."""


_COMM = comm_union_sql(grouped=False)
"""A merged rollup row's communication: the union of its op intervals (see :mod:`.ddl`)."""
_OWN = f"if(step_ns > 0, greatest(step_ns - ({_COMM}), 0), compute_ns + dataloader_ns + optimizer_ns + other_ns)"
_PARTS = f"compute_ns + dataloader_ns + optimizer_ns + other_ns + ({_COMM})"

METRICS: Final[dict[str, Metric]] = {
    m.key: m
    for m in (
        Metric("step", "step time", "ms", "if(step_ns > 0, step_ns, " + _PARTS + ") / 1e6"),
        Metric("own", "own work (step − communication)", "ms", f"({_OWN}) / 1e6"),
        Metric("compute", "compute time", "ms", "compute_ns / 1e6"),
        Metric("comm", "communication + wait time", "ms", f"({_COMM}) / 1e6"),
        Metric("comm_dp", "DP communication time", "ms", "comm_dp_ns / 1e6"),
        Metric("comm_tp", "TP communication time", "ms", "comm_tp_ns / 1e6"),
        Metric("comm_pp", "PP (p2p) wait + transfer time", "ms", "comm_pp_ns / 1e6"),
        Metric("dataloader", "data-loading time", "ms", "dataloader_ns / 1e6"),
        Metric("optimizer", "optimizer time", "ms", "optimizer_ns / 1e6"),
        Metric("idle", "untimed time (step − timed parts)", "ms", f"greatest(step_ns - ({_PARTS}), 0) / 1e6"),
        Metric("gpu_temp", "GPU temperature", "°C", metric_names=("gpu.temperature_c", "gpu.temp_c")),
        Metric("gpu_power", "GPU power", "W", metric_names=("gpu.power_w",)),
        Metric("gpu_clock", "GPU SM clock", "MHz", metric_names=("gpu.sm_clock_mhz", "gpu.clock_sm_mhz")),
        Metric("gpu_util", "GPU utilisation", "%", metric_names=("gpu.utilization_pct", "gpu.util_pct")),
    )
}

AGGREGATES: Final[dict[str, str]] = {"max": "max", "mean": "avg", "min": "min"}

_ROLLUP_PER_RANK_STEP = f"""
SELECT step, rank, step_ns, {_OWN} AS own
FROM {ROLLUP_TABLE} FINAL
WHERE job = {{job:String}} AND attempt = {{attempt:Int32}}
  AND step >= {{from_step:Int64}} AND step <= {{to_step:Int64}} AND rank >= 0 AND rank < {{world:Int32}}
"""
"""One merged row per (step, rank) in the window (``FINAL``: see the module docstring),
with its own work (step - communication, the union of its op intervals)."""

_DISPLAY_INDEX = (
    "((intDiv(rank, {s_pp:Int64}) % {n_pp:Int64}) * {n_dp:Int64} + intDiv(rank, {s_dp:Int64}) % {n_dp:Int64})"
    " * {n_tp:Int64} + intDiv(rank, {s_tp:Int64}) % {n_tp:Int64}"
)
"""A rank's row in (pp, dp, tp) order, from the topology's strides (parameters)."""

_BUCKETED = """
SELECT intDiv(disp, {{row_bucket:Int64}}) AS row, intDiv(step - {{from_step:Int64}}, {{step_bucket:Int64}}) AS col,
       {agg}(v) AS value, argMax(rank, v) AS worst_rank
FROM (SELECT step, rank, v, {disp} AS disp FROM ({inner}))
GROUP BY row, col
"""

_ROLLUP_VALUES = f"""
SELECT step, rank, {{expr}} AS v
FROM {ROLLUP_TABLE} FINAL
WHERE job = {{job:String}} AND attempt = {{attempt:Int32}}
  AND step >= {{from_step:Int64}} AND step <= {{to_step:Int64}} AND rank >= 0 AND rank < {{world:Int32}}
"""


def _rollup_values(expr: str) -> str:
    """Per-(step, rank) values of ``expr`` over the merged rollup rows."""
    return _ROLLUP_VALUES.replace("{expr}", expr)

_METRIC_VALUES = """
SELECT rank, {steps:Array(Int64)}[arrayCount(x -> x <= ts_ns, {starts:Array(Int64)})] AS step, avg(value) AS v
FROM metrics
WHERE job = {job:String} AND name = {metric_name:String} AND rank >= 0 AND rank < {world:Int32}
  AND ts_ns >= {t_from:Int64} AND ts_ns < {t_to:Int64}
GROUP BY rank, step
"""

STEP_BOUNDS = f"""
SELECT step, min(step_start_ns) AS start_ns, max(step_end_ns) AS end_ns
FROM {ROLLUP_TABLE}
WHERE job = {{job:String}} AND attempt = {{attempt:Int32}}
  AND step >= {{from_step:Int64}} AND step <= {{to_step:Int64}}
GROUP BY step HAVING end_ns > 0
ORDER BY step
"""

STEP_RANGE = f"""
SELECT min(step) AS first_step, max(step) AS last_step
FROM {ROLLUP_TABLE} WHERE job = {{job:String}} AND attempt = {{attempt:Int32}}
"""

JOB_META = """
SELECT dp, tp, pp, `order`, num_microbatches, model_flops_per_step, device_peak_flops, status, ts_ns
FROM jobs WHERE job = {job:String}
ORDER BY attempt DESC, ts_ns DESC LIMIT 1
"""

MAX_RANK = f"""
SELECT max(rank) AS max_rank FROM {ROLLUP_TABLE} WHERE job = {{job:String}} AND attempt = {{attempt:Int32}}
"""

METRIC_NAME_PRESENT = """
SELECT name FROM metrics WHERE job = {job:String} AND name IN {names:Array(String)} LIMIT 1
"""

TREND = f"""
SELECT step, quantile(0.5)(v) AS median_ns, max(v) AS max_ns, count() AS num_ranks
FROM (SELECT step, rank, step_ns AS v
      FROM {ROLLUP_TABLE} FINAL
      WHERE job = {{job:String}} AND attempt = {{attempt:Int32}}
        AND step >= {{from_step:Int64}} AND step <= {{to_step:Int64}} AND step_ns > 0)
GROUP BY step ORDER BY step
"""

RANK_SCORES = f"""
SELECT rank, quantileExact(0.5)(own) AS own_ns, max(step) AS last_step, count() AS num_steps,
       if(countIf(step_ns > 0) > 0, maxIf(step, step_ns > 0), -1) AS last_done_step
FROM ({_ROLLUP_PER_RANK_STEP})
GROUP BY rank
"""
"""``last_done_step``: the last completed step in the window, -1 when none (then
:data:`RANK_LAST_STEP` over the whole history has it)."""

RANK_LAST_STEP = f"""
SELECT rank, max(step) AS last_step FROM {ROLLUP_TABLE}
WHERE job = {{job:String}} AND attempt = {{attempt:Int32}} AND step_ns > 0
GROUP BY rank
"""

LATEST_HEARTBEATS = f"""
SELECT rank, argMax(host, t) AS hb_host, max(t) AS hb_ts_ns, argMax(a, t) AS hb_alive,
       argMax(s, t) AS hb_last_step, argMax(o, t) AS hb_inflight_op
FROM (SELECT rank, host, pid, max(ts_ns) AS t, argMaxMerge(alive) AS a, max(last_step) AS s,
             argMaxMerge(inflight_op) AS o
      FROM `{HEARTBEATS_LATEST_TABLE}` WHERE job = {{job:String}} AND rank >= 0 GROUP BY rank, host, pid)
GROUP BY rank
"""
"""Each rank's newest heartbeat (host, time, alive, step, in-flight op) from
``heartbeats_latest``: a few state rows per rank however long the job has run."""

LATEST_INFLIGHT = f"""
SELECT rank, {", ".join(f"{inflight_field(n)} AS if_{n}" for n in ("kind", "op", "group_id", "seq", "peer", "since_ns", "step"))},
       last_ts AS if_ts_ns
FROM ({INFLIGHT_NEWEST_ROWS})
"""
"""Each rank's newest in-flight row (kept at insert time: a few rows per rank, not every
in-flight row of the job)."""

_SPAN_FILTER = (
    "job = {job:String} AND attempt = {attempt:Int32} AND step >= {from_step:Int64} "
    "AND step <= {to_step:Int64} AND has({ranks:Array(Int32)}, rank)"
)

SPANS = f"""
SELECT * FROM (
  SELECT rank, step, microbatch AS mb, name, kind, 'section' AS cat, start_ns, end_ns,
         '' AS op, '' AS group_id, toInt64(-1) AS seq, toInt32(-1) AS peer, '' AS state
  FROM sections WHERE {_SPAN_FILTER}
  UNION ALL
  SELECT rank, step, microbatch AS mb, op AS name, axis AS kind,
         if(op IN ('send', 'recv', 'isend', 'irecv') OR peer >= 0, 'p2p', 'collective') AS cat,
         enqueued_ns AS start_ns, if(completed_ns >= 0, completed_ns, {{now_ns:Int64}}) AS end_ns,
         op, group_id, seq, peer, state
  FROM collectives WHERE {_SPAN_FILTER}
)
ORDER BY start_ns, rank
LIMIT {{limit:UInt64}}
"""

COUNT_SPANS = f"""
SELECT (SELECT count() FROM sections WHERE {_SPAN_FILTER})
     + (SELECT count() FROM collectives WHERE {_SPAN_FILTER}) AS n
"""

RANK_HOST = """
SELECT host FROM (
  SELECT host, max(ts_ns) AS t FROM heartbeats WHERE job = {job:String} AND rank = {rank:Int32} GROUP BY host
  UNION ALL
  SELECT host, max(start_ns) AS t FROM steps WHERE job = {job:String} AND rank = {rank:Int32} GROUP BY host
) WHERE host != '' ORDER BY t DESC LIMIT 1
"""

RANK_WINDOW = f"""
SELECT min(step_start_ns) AS t_from, max(step_end_ns) AS t_to FROM {ROLLUP_TABLE}
WHERE job = {{job:String}} AND attempt = {{attempt:Int32}} AND rank = {{rank:Int32}}
  AND step >= {{from_step:Int64}} AND step <= {{to_step:Int64}} AND step_ns > 0
"""

HOST_METRICS = """
SELECT name, device, ts_ns, value FROM metrics
WHERE host = {host:String} AND ts_ns >= {t_from:Int64} AND ts_ns <= {t_to:Int64}
  AND ((source = 'gpu' AND (rank = {rank:Int32} OR rank < 0)) OR source IN ('nic', 'rdma'))
ORDER BY name, device, ts_ns
LIMIT {limit:UInt64}
"""

HOST_EVENTS = """
SELECT ts_ns, kind, severity, message, rank FROM log_events
WHERE (host = {host:String} OR (job = {job:String} AND rank = {rank:Int32}))
  AND ts_ns >= {t_from:Int64} AND ts_ns <= {t_to:Int64}
ORDER BY ts_ns LIMIT 200
"""


# ---------------------------------------------------------------------------------------
def topology_params(topo: Topology) -> dict[str, int]:
    """Strides and sizes that turn a rank into its (pp, dp, tp) display index in SQL."""
    strides, stride = {}, 1
    for axis in topo.axes_fastest_first:
        strides[axis] = stride
        stride *= topo.size(axis)
    return {
        **{f"s_{a}": strides[a] for a in ("dp", "pp", "tp")},
        **{f"n_{a}": topo.size(a) for a in ("dp", "pp", "tp")},
        "world": topo.world_size,
    }


def heatmap_cells(
    store: Any,
    job: str,
    attempt: int,
    topo: Topology,
    metric: Metric,
    agg: str,
    from_step: int,
    to_step: int,
    row_bucket: int,
    step_bucket: int,
) -> pd.DataFrame:
    """Aggregated cells ``(row, col, value, worst_rank)`` of the heat-map.

    Rows are buckets of ``row_bucket`` ranks in (pp, dp, tp) order, columns buckets of
    ``step_bucket`` steps from ``from_step``; ``worst_rank`` is the rank with the
    largest value in the cell.
    """
    params: dict[str, Any] = {
        "job": job,
        "attempt": attempt,
        "from_step": from_step,
        "to_step": to_step,
        "row_bucket": row_bucket,
        "step_bucket": step_bucket,
        **topology_params(topo),
    }
    if metric.sql:
        inner = _rollup_values(metric.sql)
    else:
        bounds = store.query_df(STEP_BOUNDS, params)
        name = metric_name_present(store, job, metric)
        if bounds.empty or name is None:
            return pd.DataFrame(columns=["row", "col", "value", "worst_rank"])
        params.update(
            steps=[int(s) for s in bounds["step"]],
            starts=[int(s) for s in bounds["start_ns"]],
            t_from=int(bounds["start_ns"].min()),
            t_to=int(bounds["end_ns"].max()),
            metric_name=name,
        )
        inner = _METRIC_VALUES
    sql = _BUCKETED.format(agg=AGGREGATES[agg], disp=_DISPLAY_INDEX, inner=inner)
    return store.query_df(sql, params)


def metric_name_present(store: Any, job: str, metric: Metric) -> str | None:
    """The first of ``metric.metric_names`` that the job has samples of."""
    rows = store.query_rows(METRIC_NAME_PRESENT, {"job": job, "names": list(metric.metric_names)})
    return str(rows[0]["name"]) if rows else None


def job_meta(store: Any, job: str) -> dict[str, Any] | None:
    """Latest ``jobs`` record of the job (topology, FLOPs, status), ``None`` if absent."""
    rows = store.query_rows(JOB_META, {"job": job})
    return rows[0] if rows else None


def max_rank(store: Any, job: str, attempt: int) -> int:
    rows = store.query_rows(MAX_RANK, {"job": job, "attempt": attempt})
    return int(rows[0]["max_rank"]) if rows and rows[0]["max_rank"] is not None else -1


def step_range(store: Any, job: str, attempt: int) -> tuple[int, int] | None:
    rows = store.query_rows(STEP_RANGE, {"job": job, "attempt": attempt})
    if not rows or rows[0]["last_step"] is None:
        return None
    return int(rows[0]["first_step"]), int(rows[0]["last_step"])


def trend(store: Any, job: str, attempt: int, from_step: int, to_step: int) -> pd.DataFrame:
    return store.query_df(TREND, {"job": job, "attempt": attempt, "from_step": from_step, "to_step": to_step})


def rank_scores(store: Any, job: str, attempt: int, world: int, from_step: int, to_step: int) -> pd.DataFrame:
    """Per rank: median own-work time over the window, last step seen, steps seen and
    last completed step in the window (-1 if none)."""
    return store.query_df(
        RANK_SCORES,
        {"job": job, "attempt": attempt, "world": world, "from_step": from_step, "to_step": to_step},
    )


def rank_last_steps(store: Any, job: str, attempt: int) -> pd.DataFrame:
    return store.query_df(RANK_LAST_STEP, {"job": job, "attempt": attempt})


def latest_heartbeats(store: Any, job: str) -> pd.DataFrame:
    return store.query_df(LATEST_HEARTBEATS, {"job": job})


def latest_inflight(store: Any, job: str, attempt: int) -> pd.DataFrame:
    return store.query_df(LATEST_INFLIGHT, {"job": job, "attempt": attempt})


def spans(
    store: Any, job: str, attempt: int, ranks: list[int], from_step: int, to_step: int, limit: int, now_ns: int
) -> tuple[pd.DataFrame, int]:
    """Sections and collectives of ``ranks`` in the step window (earliest ``limit``) and
    the total number that matched."""
    params = {
        "job": job,
        "attempt": attempt,
        "ranks": ranks,
        "from_step": from_step,
        "to_step": to_step,
        "limit": limit,
        "now_ns": now_ns,
    }
    df = store.query_df(SPANS, params)
    total = store.query_rows(COUNT_SPANS, params)
    return df, int(total[0]["n"]) if total else len(df)


def rank_host(store: Any, job: str, rank: int) -> str | None:
    rows = store.query_rows(RANK_HOST, {"job": job, "rank": rank})
    return str(rows[0]["host"]) if rows else None


def rank_window(store: Any, job: str, attempt: int, rank: int, from_step: int, to_step: int) -> tuple[int, int] | None:
    rows = store.query_rows(
        RANK_WINDOW, {"job": job, "attempt": attempt, "rank": rank, "from_step": from_step, "to_step": to_step}
    )
    if not rows or not rows[0]["t_to"]:
        return None
    return int(rows[0]["t_from"]), int(rows[0]["t_to"])


def host_metrics(store: Any, host: str, rank: int, t_from: int, t_to: int, limit: int = 20_000) -> pd.DataFrame:
    return store.query_df(
        HOST_METRICS, {"host": host, "rank": rank, "t_from": t_from, "t_to": t_to, "limit": limit}
    )


def host_events(store: Any, host: str, job: str, rank: int, t_from: int, t_to: int) -> pd.DataFrame:
    return store.query_df(
        HOST_EVENTS, {"host": host, "job": job, "rank": rank, "t_from": t_from, "t_to": t_to}
    )


def empty_spans() -> pd.DataFrame:
    """A span frame with the columns of :data:`SPANS` and no rows."""
    return pd.DataFrame(
        columns=["rank", "step", "mb", "name", "kind", "cat", "start_ns", "end_ns", "op", "group_id", "seq", "peer", "state"]
    )
