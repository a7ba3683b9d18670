"""ClickHouse SQL used by the collector and the jobs routes; every value is a
``{name:Type}`` parameter, never formatted into the text.

Per-rank-per-step figures come from the ``step_rollup`` table (see
:mod:`fleetscope.server.store.ddl`), not from raw events. Rollup rows are partial
aggregates until ClickHouse merges them, so every query groups by its key again.
Communication (``comm_ns``) is the union of a rank-step's op intervals
(:func:`.ddl.comm_union_sql`); the per-axis columns are plain sums per axis.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .ddl import BATCHES_TABLE, ROLLUP_TABLE, comm_union_sql

WRITTEN_BATCHES = f"""
SELECT DISTINCT batch, `table` FROM {BATCHES_TABLE}
WHERE batch IN {{batches:Array(String)}}
"""

LATEST_ATTEMPT = f"""
SELECT max(attempt) AS attempt, count() AS n FROM {ROLLUP_TABLE} WHERE job = {{job:String}}
"""

STEP_BREAKDOWN = f"""
SELECT step, rank,
       sum(compute_ns) AS compute_ns, sum(dataloader_ns) AS dataloader_ns,
       sum(optimizer_ns) AS optimizer_ns, sum(other_ns) AS other_ns,
       {comm_union_sql(grouped=True)} AS comm_ns, sum(comm_dp_ns) AS comm_dp_ns, sum(comm_tp_ns) AS comm_tp_ns,
       sum(comm_pp_ns) AS comm_pp_ns, sum(comm_world_ns) AS comm_world_ns,
       sum(num_collectives) AS num_collectives, sum(num_sections) AS num_sections,
       max(step_ns) AS step_ns, min(step_start_ns) AS step_start_ns, max(step_end_ns) AS step_end_ns
FROM {ROLLUP_TABLE}
WHERE job = {{job:String}} AND attempt = {{attempt:Int32}}
  AND step >= {{from_step:Int64}} AND step <= {{to_step:Int64}}
  AND (empty({{ranks:Array(Int32)}}) OR has({{ranks:Array(Int32)}}, rank))
GROUP BY step, rank
ORDER BY step, rank
LIMIT {{limit:UInt64}}
"""

STEP_ENDS = f"""
SELECT step, max(step_end_ns) AS end_ns, min(step_start_ns) AS start_ns, uniqExact(rank) AS num_ranks
FROM {ROLLUP_TABLE}
WHERE job = {{job:String}} AND attempt = {{attempt:Int32}} AND step_ns > 0
GROUP BY step
ORDER BY step DESC
LIMIT {{limit:UInt64}}
"""

JOB_ACTIVITY = f"""
SELECT uniqExact(rank) AS num_ranks, max(step) AS last_step, min(step) AS first_step
FROM {ROLLUP_TABLE}
WHERE job = {{job:String}} AND attempt = {{attempt:Int32}}
"""


def written_batches(client: Any, batches: list[str]) -> set[tuple[str, str]]:
    """(batch id, table) pairs already in the store for these batch ids."""
    if not batches:
        return set()
    rows = client.query(WRITTEN_BATCHES, parameters={"batches": batches}).result_rows
    return {(str(b), str(t)) for b, t in rows}


def latest_attempt(store: Any, job: str) -> int | None:
    """Highest attempt with rollup data for ``job``; ``None`` when the job has none."""
    rows = store.query_rows(LATEST_ATTEMPT, {"job": job})
    if not rows or not rows[0]["n"]:
        return None
    return int(rows[0]["attempt"])


def step_breakdown(
    store: Any,
    job: str,
    attempt: int,
    from_step: int,
    to_step: int,
    ranks: list[int],
    limit: int,
) -> pd.DataFrame:
    """Per rank per step: section time by kind, collective time by axis, step time.

    Adds ``total_ns`` (the step duration, or the sum of the parts when no step marker
    arrived), ``busy_ns`` and ``idle_ns`` (step time not covered by sections or
    collectives, floored at 0; nested timings make it a lower bound).
    """
    df = store.query_df(
        STEP_BREAKDOWN,
        {
            "job": job,
            "attempt": attempt,
            "from_step": from_step,
            "to_step": to_step,
            "ranks": ranks,
            "limit": limit,
        },
    )
    if df.empty:
        return df
    busy = (
        df["compute_ns"] + df["dataloader_ns"] + df["optimizer_ns"] + df["other_ns"] + df["comm_ns"]
    )
    df["busy_ns"] = busy
    df["total_ns"] = df["step_ns"].where(df["step_ns"] > 0, busy)
    df["idle_ns"] = (df["total_ns"] - busy).clip(lower=0)
    return df


def step_rate(store: Any, job: str, attempt: int, window: int = 20) -> dict[str, Any]:
    """Steps per second over the last ``window`` completed steps, with the last step.

    Returns a dict with ``steps_per_s`` (``None`` with fewer than 2 steps),
    ``last_step``, ``num_ranks`` and ``last_step_end_ns``.
    """
    df = store.query_df(STEP_ENDS, {"job": job, "attempt": attempt, "limit": window})
    out: dict[str, Any] = {"steps_per_s": None, "last_step": None, "num_ranks": 0, "last_step_end_ns": None}
    if df.empty:
        return out
    df = df.sort_values("step")
    out["last_step"] = int(df["step"].iloc[-1])
    out["num_ranks"] = int(df["num_ranks"].max())
    out["last_step_end_ns"] = int(df["end_ns"].iloc[-1])
    if len(df) >= 2:
        span_ns = int(df["end_ns"].iloc[-1]) - int(df["end_ns"].iloc[0])
        num_steps = int(df["step"].iloc[-1]) - int(df["step"].iloc[0])
        if span_ns > 0 and num_steps > 0:
            out["steps_per_s"] = num_steps / (span_ns / 1e9)
    return out
