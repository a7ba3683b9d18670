"""ClickHouse SQL behind ``GET /metrics`` (see :mod:`fleetscope.server.metrics`).

Every query is a key-range read of one job: ``step_rollup`` is ordered by
``(job, attempt, step, rank)`` and ``steps`` by ``(job, step, rank)``, so a query for the
steps after a known one reads only those steps' rows (one per rank), never a window of
raw sections or collectives. Values are ``{name:Type}`` parameters, never formatted in.
"""

from __future__ import annotations

from typing import Any

from .ddl import ROLLUP_TABLE

LATEST_STEP = f"""
SELECT step FROM {ROLLUP_TABLE}
WHERE job = {{job:String}} AND attempt = {{attempt:Int32}}
ORDER BY job DESC, attempt DESC, step DESC
LIMIT 1
"""
"""The job's newest step (read in reverse key order: no scan of the job's rows)."""

STEPS_AFTER = f"""
SELECT step, max(step_ns) AS step_ns, max(step_end_ns) AS end_ns, uniqExact(rank) AS num_ranks
FROM {ROLLUP_TABLE}
WHERE job = {{job:String}} AND attempt = {{attempt:Int32}} AND step > {{after:Int64}}
GROUP BY step
HAVING step_ns > 0
ORDER BY step
LIMIT {{limit:UInt64}}
"""
"""Per step after ``after``: the step's duration (its slowest rank), when it ended, and
how many ranks have reported it so far."""

STEP_TOKENS = """
SELECT sum(tokens) AS tokens, uniqExact(rank) AS num_ranks FROM steps
WHERE job = {job:String} AND step = {step:Int64} AND attempt = {attempt:Int32}
"""
"""Tokens of one step: every rank reports its data-parallel replica's tokens."""


def latest_step(store: Any, job: str, attempt: int) -> int | None:
    """The newest step with rollup rows, or ``None`` when the job has none."""
    rows = store.query_rows(LATEST_STEP, {"job": job, "attempt": attempt})
    return int(rows[0]["step"]) if rows else None


def steps_after(store: Any, job: str, attempt: int, after: int, limit: int) -> list[dict[str, int]]:
    """Steps after ``after`` in order: ``step``, ``step_ns``, ``end_ns``, ``num_ranks``."""
    rows = store.query_rows(STEPS_AFTER, {"job": job, "attempt": attempt, "after": after, "limit": limit})
    return [{k: int(v) for k, v in r.items()} for r in rows]


def step_tokens(store: Any, job: str, attempt: int, step: int, dp: int) -> float:
    """Tokens the whole job processed in ``step`` (0 when the trainer did not say)."""
    rows = store.query_rows(STEP_TOKENS, {"job": job, "attempt": attempt, "step": step})
    if not rows or not rows[0]["num_ranks"]:
        return 0.0
    return float(rows[0]["tokens"]) / int(rows[0]["num_ranks"]) * max(dp, 1)
