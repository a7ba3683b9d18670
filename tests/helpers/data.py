"""Builders of valid synthetic telemetry rows for any record type (derived from the schema)."""

from __future__ import annotations

import time
from typing import Any

from fleetscope.schema import RECORD_TYPES, ColType

BASE_NS = 1_764_000_000 * 10**9
"""A fixed, realistic time (late 2025) so tests are deterministic and inside the TTL
window only if the TTL is long; use ``now_ns()`` for data that must not expire."""


def now_ns() -> int:
    return time.time_ns()


def sample_rows(record: str, n: int, job: str = "job-test", t0_ns: int | None = None, **fixed: Any) -> list[dict[str, Any]]:
    """``n`` valid rows of ``record``: every column set, time columns increasing from
    ``t0_ns`` (default: now), ``fixed`` values override any column."""
    rt = RECORD_TYPES[record]
    t0 = now_ns() if t0_ns is None else t0_ns
    rows = []
    for i in range(n):
        row: dict[str, Any] = {}
        for c in rt.columns:
            if c.name in fixed:
                row[c.name] = fixed[c.name]
            elif c.name in rt.time_columns:
                row[c.name] = t0 + i * 1_000_000 + (500_000 if c.name.startswith(("end", "completed")) else 0)
            elif c.name == "attempt":
                row[c.name] = 0
            elif c.name == "job":
                row[c.name] = job
            elif c.name in ("rank", "step", "seq"):
                row[c.name] = i
            elif c.name == "duration_ns":
                row[c.name] = 500_000
            elif c.name in ("dp", "tp", "pp"):
                row[c.name] = 1
            elif c.name == "num_microbatches":  # a job has at least one
                row[c.name] = 1 + i % 7
            elif c.name == "order":
                row[c.name] = "tp-dp-pp"
            elif c.name == "status":
                row[c.name] = "running"
            elif c.type in (ColType.STRING, ColType.SYMBOL):
                row[c.name] = f"{c.name}-{i % 3}"
            elif c.type == ColType.BOOL:
                row[c.name] = bool(i % 2)
            elif c.type == ColType.FLOAT64:
                row[c.name] = float(i) + 0.5
            else:
                row[c.name] = i % 7
        rows.append(row)
    return rows


def sample_batch(n: int = 5, job: str = "job-test", t0_ns: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """``n`` rows of every record type."""
    return {name: sample_rows(name, n, job=job, t0_ns=t0_ns) for name in RECORD_TYPES}
