"""ClickHouse SQL for self-check probe results (the ``probes`` table).

Used by :mod:`fleetscope.server.diagnosis.selfcheck`. Every value is a ``{name:Type}``
parameter. A result's *variant* (dtype, sizes, kernel: what exactly was measured) is
in its JSON ``detail``; only results with equal variants are compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

RECENT_PROBES = """
SELECT ts_ns, job, host, device, device_model, probe,
       JSONExtractString(detail, 'variant') AS variant,
       value, unit, peak_fraction, passed, detail
FROM probes
WHERE ts_ns >= {since_ns:Int64}
  AND (empty({host:String}) OR host = {host:String})
  AND (empty({models:Array(String)}) OR has({models:Array(String)}, device_model))
ORDER BY host, device, probe, variant, ts_ns DESC
LIMIT {per_key:UInt64} BY host, device, probe, variant
LIMIT {limit:UInt64}
"""

JOB_PROBES = """
SELECT ts_ns, job, host, device, device_model, probe,
       JSONExtractString(detail, 'variant') AS variant,
       value, unit, peak_fraction, passed, detail
FROM probes
WHERE job = {job:String}
ORDER BY ts_ns, host, device
LIMIT {limit:UInt64}
"""

MAX_ROWS = 2_000_000


def recent_probes(
    store: Any,
    *,
    since_ns: int,
    per_key: int = 1,
    host: str = "",
    models: Sequence[str] = (),
    limit: int = MAX_ROWS,
) -> list[dict[str, Any]]:
    """The newest ``per_key`` results of every (host, device, probe, variant).

    Args:
        store: the telemetry store.
        since_ns: ignore results older than this.
        per_key: results kept per key, newest first (1 = latest only).
        host: only this host ('' = all).
        models: only these device models (empty = all).
        limit: cap on the rows returned.
    """
    return store.query_rows(  # type: ignore[no-any-return]
        RECENT_PROBES,
        {
            "since_ns": int(since_ns),
            "host": host,
            "models": list(models),
            "per_key": max(1, int(per_key)),
            "limit": int(limit),
        },
    )


def job_probes(store: Any, job: str, limit: int = MAX_ROWS) -> list[dict[str, Any]]:
    """Every probe result recorded with ``job`` (e.g. by the job's preflight), oldest first."""
    return store.query_rows(JOB_PROBES, {"job": job, "limit": int(limit)})  # type: ignore[no-any-return]
