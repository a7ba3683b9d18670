"""``GET /api/v1/store/stats``: rows per telemetry table and ingest counters (operators,
tests and benchmarks use it to see what the store holds)."""

from __future__ import annotations

from fastapi import APIRouter
from fleetscope.server.api.deps import CollectorDep, StoreDep
from fleetscope.server.store.ddl import BATCHES_TABLE, ROLLUP_TABLE

from fleetscope.schema import RECORD_TYPES

router = APIRouter(tags=["store"])

TABLE_ROWS = """
SELECT table, sum(rows) AS rows FROM system.parts
WHERE active AND database = currentDatabase() AND has({tables:Array(String)}, table)
GROUP BY table
"""


@router.get("/store/stats")
def store_stats(store: StoreDep, collector: CollectorDep) -> dict:
    """Rows stored per record table (plus the batch registry and the step rollup), the
    ingest counters of this process and the last clock offset each host sent."""
    tables = [*RECORD_TYPES, BATCHES_TABLE, ROLLUP_TABLE]
    rows = {t: 0 for t in tables}
    for r in store.query_rows(TABLE_ROWS, {"tables": tables}):
        rows[r["table"]] = int(r["rows"])
    return {
        "store": store.url.redacted(),
        "rows": rows,
        "ingest": collector.stats,
        "queued_rows": collector.queued_rows,
        "clock_offsets": collector.clock_offsets,
        "hosts_seen_ns": collector.host_seen_ns,
    }
