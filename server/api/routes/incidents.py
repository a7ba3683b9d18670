"""Incidents: list (filters + pagination), detail, acknowledge, resolve."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fleetscope.server.alerts.outbox import enqueue_incident, public_error
from fleetscope.server.api.deps import SessionDep
from fleetscope.server.db.diagnosis_models import AlertOutbox, Incident
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, or_, select

router = APIRouter(tags=["incidents"])
STATUSES = ("open", "acknowledged", "resolved")


class IncidentOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "id": 7, "job": "demo", "key": "hang", "kind": "hang", "status": "open", "severity": "critical",
        "summary": "no step completed for 41s after step 19; culprit rank(s) [3]: stuck_in_compute",
        "ranks": [3], "hosts": ["node-0"], "group_id": "", "score": 1.4, "est_slowdown": 1.0,
        "first_step": 20, "last_step": 20, "evidence": {"hang_class": "stuck_in_compute"},
        "opened_ns": 1764460800000000000, "updated_ns": 1764460800000000000,
        "last_seen_ns": 1764460810000000000, "resolved_ns": None, "acknowledged_ns": None,
        "acknowledged_by": "", "resolution": "", "num_updates": 1}]})
    id: int
    job: str
    key: str
    kind: str
    status: str
    severity: str
    summary: str
    ranks: list[int] = Field(description="culprit ranks first")
    hosts: list[str]
    group_id: str
    score: float
    est_slowdown: float
    first_step: int
    last_step: int
    evidence: dict[str, Any]
    opened_ns: int
    updated_ns: int
    last_seen_ns: int
    resolved_ns: int | None
    acknowledged_ns: int | None
    acknowledged_by: str
    resolution: str
    num_updates: int


class IncidentDetail(IncidentOut):
    notifications: list[dict[str, Any]] = Field(description="alert outbox rows of this incident")


class IncidentPage(BaseModel):
    total: int
    offset: int
    limit: int
    items: list[IncidentOut]


class AckIn(BaseModel):
    by: str = Field("", max_length=200, examples=["alice"])


class ResolveIn(BaseModel):
    by: str = Field("", max_length=200, examples=["alice"])
    resolution: str = Field("resolved by operator", max_length=2000)


@router.get("/incidents", response_model=IncidentPage)
def list_incidents(
    session: SessionDep,
    job: str | None = None,
    status: Annotated[str | None, Query(description="open | acknowledged | resolved | active (open+acknowledged)")] = None,
    kind: str | None = None,
    rank: Annotated[int | None, Query(ge=0, description="incidents naming this rank")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict:
    """Incidents, newest first: one page of at most ``limit`` rows (``total`` counts all
    that match). Filtering, counting and paging run in SQL on an index, so the cost of
    a request does not grow with the incidents kept."""
    conds = []
    if job:
        conds.append(Incident.job == job)
    if status:
        if status not in (*STATUSES, "active"):
            raise HTTPException(422, detail=f"status {status!r}: expected one of {[*STATUSES, 'active']}")
        conds.append(Incident.status.in_(("open", "acknowledged")) if status == "active"
                     else Incident.status == status)
    if kind:
        conds.append(Incident.kind == kind)
    if rank is not None:  # ranks is a JSON list in text: match the element, not a digit run
        conds.append(or_(*(Incident.ranks.like(p) for sep in (",", ", ")
                           for p in (f"[{rank}]", f"[{rank}{sep}%", f"%{sep}{rank}{sep}%", f"%{sep}{rank}]"))))
    total = session.scalar(select(func.count()).select_from(Incident).where(*conds)) or 0
    q = (select(Incident).where(*conds).order_by(Incident.opened_ns.desc(), Incident.id.desc())
         .offset(offset).limit(limit))
    return {"total": total, "offset": offset, "limit": limit,
            "items": [r.to_dict() for r in session.scalars(q)]}


def _get(session: Any, incident_id: int) -> Incident:
    inc = session.get(Incident, incident_id)
    if inc is None:
        raise HTTPException(404, detail=f"incident {incident_id} not found")
    return inc


@router.get("/incidents/{incident_id}", response_model=IncidentDetail)
def get_incident(incident_id: int, session: SessionDep) -> dict:
    """One incident with its evidence and alert notifications."""
    inc = _get(session, incident_id)
    notes = session.scalars(select(AlertOutbox).where(AlertOutbox.incident_id == incident_id).order_by(AlertOutbox.id))
    return {**inc.to_dict(), "notifications": [
        {k: (public_error(v) if k == "last_error" else v) for k, v in n.to_dict().items() if k != "alert"}
        for n in notes]}


@router.post("/incidents/{incident_id}/acknowledge", response_model=IncidentOut)
def acknowledge(incident_id: int, body: AckIn, session: SessionDep) -> dict:
    """Mark an open incident as seen by an operator (it stays active, no new alerts)."""
    inc = _get(session, incident_id)
    if inc.status == "resolved":
        raise HTTPException(409, detail=f"incident {incident_id} is already resolved")
    inc.status, inc.acknowledged_ns, inc.acknowledged_by = "acknowledged", time.time_ns(), body.by
    session.commit()
    return inc.to_dict()


@router.post("/incidents/{incident_id}/resolve", response_model=IncidentOut)
def resolve(incident_id: int, body: ResolveIn, request: Request, session: SessionDep) -> dict:
    """Resolve an incident by hand; webhooks that got its firing alert get a resolved one."""
    inc = _get(session, incident_id)
    if inc.status == "resolved":
        raise HTTPException(409, detail=f"incident {incident_id} is already resolved")
    now = time.time_ns()
    inc.status, inc.resolved_ns, inc.updated_ns = "resolved", now, now
    inc.resolution = f"{body.resolution} ({body.by})" if body.by else body.resolution
    session.commit()
    base = str(request.app.state.settings.public_url or "")
    if enqueue_incident(session, inc, now, base):
        d = request.app.state.alert_dispatcher
        if d is not None:
            d.wake()
    return inc.to_dict()
