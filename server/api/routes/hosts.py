"""``GET /hosts/{host}``: one host across jobs - ranks it served, how often it straggled or
hung a job, hardware events, and its self-check results when available."""

from __future__ import annotations

import importlib
import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fleetscope.server.api.deps import SessionDep, StoreDep
from fleetscope.server.db.diagnosis_models import Incident
from fleetscope.server.diagnosis.findings import STRAGGLER_KINDS
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

router = APIRouter(tags=["diagnosis"])

HOST_JOBS = """
SELECT job, attempt, groupUniqArray(rank) AS ranks, min(start_ns) AS first_ns, max(end_ns) AS last_ns,
       uniqExact(step) AS num_steps
FROM steps WHERE host = {host:String} AND start_ns >= {since_ns:Int64}
GROUP BY job, attempt ORDER BY last_ns DESC LIMIT {limit:UInt32}
"""

HOST_EVENTS = """
SELECT ts_ns, job, rank, kind, severity, message FROM log_events
WHERE host = {host:String} AND ts_ns >= {since_ns:Int64}
ORDER BY ts_ns DESC LIMIT 50
"""


class HostOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "host": "node-3", "num_jobs": 4, "num_straggler_jobs": 3, "straggler_rate": 0.75,
        "jobs": [{"job": "demo", "attempt": 0, "ranks": [12, 13], "num_steps": 400,
                  "incidents": {"slow_compute": 1}}],
        "incidents": [], "log_events": [], "selfcheck": None}]})
    host: str
    num_jobs: int
    num_straggler_jobs: int = Field(description="jobs in which a straggler incident named this host")
    straggler_rate: float
    jobs: list[dict[str, Any]]
    incidents: list[dict[str, Any]]
    log_events: list[dict[str, Any]]
    selfcheck: Any = Field(None, description="self-check summary (fleet-relative scores) if available")


@router.get("/hosts/{host}", response_model=HostOut)
def host_history(
    host: str, store: StoreDep, session: SessionDep,
    days: Annotated[float, Query(gt=0, le=3650, description="look back this many days")] = 30,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict:
    """How often this host straggled, across the jobs it ran."""
    since = time.time_ns() - int(days * 86400e9)
    jobs = store.query_rows(HOST_JOBS, {"host": host, "since_ns": since, "limit": limit})
    incidents = [i.to_dict() for i in session.scalars(
        select(Incident).where(Incident.hosts.contains(json.dumps(host)), Incident.opened_ns >= since)
        .order_by(Incident.opened_ns.desc()).limit(limit))]
    incidents = [i for i in incidents if host in i["hosts"]]
    events = store.query_rows(HOST_EVENTS, {"host": host, "since_ns": since})
    selfcheck = _selfcheck(store, host)
    if not jobs and not incidents and not events and selfcheck is None:
        raise HTTPException(404, detail=f"host {host!r}: no data in the last {days:g} days")
    per_job: dict[str, dict[str, int]] = {}
    for i in incidents:
        per_job.setdefault(i["job"], {})
        per_job[i["job"]][i["kind"]] = per_job[i["job"]].get(i["kind"], 0) + 1
    job_ids = {j["job"] for j in jobs} | set(per_job)
    strag = {j for j, kinds in per_job.items() if any(k in STRAGGLER_KINDS for k in kinds)}
    return {
        "host": host, "num_jobs": len(job_ids), "num_straggler_jobs": len(strag),
        "straggler_rate": round(len(strag) / max(len(job_ids), 1), 4),
        "jobs": [{"job": j["job"], "attempt": int(j["attempt"]), "ranks": sorted(int(r) for r in j["ranks"]),
                  "first_ns": int(j["first_ns"]), "last_ns": int(j["last_ns"]), "num_steps": int(j["num_steps"]),
                  "incidents": per_job.get(j["job"], {})} for j in jobs],
        "incidents": incidents,
        "log_events": [{k: (int(v) if k in ("ts_ns", "rank") else v) for k, v in e.items()} for e in events],
        "selfcheck": selfcheck,
    }


def _selfcheck(store: Any, host: str) -> Any:
    try:
        mod = importlib.import_module("fleetscope.server.diagnosis.selfcheck")
    except ModuleNotFoundError:
        return None
    fn = getattr(mod, "host_summary", None)
    if fn is None:
        return None
    try:
        return _plain(fn(store, host))
    except Exception as e:  # a broken optional component must not break host history
        return {"error": f"{type(e).__name__}: {e}"}


def _plain(v: Any) -> Any:
    from fleetscope.server.diagnosis.findings import _jsonable

    if hasattr(v, "__dataclass_fields__"):
        from dataclasses import asdict

        v = asdict(v)
    return _jsonable(v)
