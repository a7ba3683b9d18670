"""Upsert control-plane ``jobs`` rows (SQL) from ``jobs`` telemetry records.

Rank 0 writes a ``jobs`` record with status ``running`` at start and one with
``finished``/``failed`` at the end. Records may arrive out of order or twice (agent
retries), so the merge is order-independent and idempotent:

* a higher ``attempt`` replaces the row's lifetime (a restart); a lower one is ignored;
* within an attempt, ``start_ns`` is the earliest ``running`` record, a terminal status
  wins over ``running`` and sets ``end_ns``;
* descriptive fields (topology, FLOPs, device, command) come from the newest record.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from fleetscope.server.db.models import Job
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

TERMINAL = ("finished", "failed")
_DESCRIPTIVE = (
    "name",
    "dp",
    "tp",
    "pp",
    "order",
    "num_microbatches",
    "model_flops_per_step",
    "device_name",
    "device_peak_flops",
    "command",
    "versions",
    "host",
)


def upsert_jobs(db: sessionmaker[Session], tables: list[pa.Table]) -> int:
    """Merge the rows of ``jobs`` tables into the SQL ``jobs`` table; returns rows seen."""
    rows: list[dict[str, Any]] = []
    for t in tables:
        rows.extend(t.to_pylist())
    if not rows:
        return 0
    rows.sort(key=lambda r: (r["attempt"], r["ts_ns"]))
    for attempt in range(2):  # a concurrent writer may insert the same new job id
        try:
            with db.begin() as session:
                for r in rows:
                    _merge(session, r)
            break
        except IntegrityError:
            if attempt:
                raise
    return len(rows)


def _merge(session: Session, r: dict[str, Any]) -> None:
    job = session.get(Job, r["job"])
    if job is None:
        job = Job(id=r["job"], attempt=r["attempt"], status=r["status"], updated_ns=0)
        session.add(job)
        session.flush()
    if r["attempt"] < job.attempt:
        return
    if r["attempt"] > job.attempt:
        job.attempt, job.start_ns, job.end_ns, job.status = r["attempt"], None, None, "running"
    ts = r["ts_ns"]
    if r["status"] in TERMINAL:
        job.status = r["status"]
        job.end_ns = ts if job.end_ns is None else max(job.end_ns, ts)
    else:
        if job.status not in TERMINAL:
            job.status = r["status"]
        job.start_ns = ts if job.start_ns is None else min(job.start_ns, ts)
    if ts >= (job.updated_ns or 0):
        for f in _DESCRIPTIVE:
            setattr(job, f, r[f])
        job.updated_ns = ts
