"""``GET /jobs/{job}/hang``: current hang analysis (stalled since, culprits, class, chain)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fleetscope.server.api.deps import SessionDep, StoreDep
from fleetscope.server.diagnosis.api_support import HangOut, job_diagnosis
from fleetscope.server.diagnosis.findings import _jsonable

router = APIRouter(tags=["diagnosis"])


@router.get("/jobs/{job}/hang", response_model=HangOut)
def hang(request: Request, job: str, store: StoreDep, session: SessionDep) -> dict:
    """Is the job stalled; if so which ranks are the culprits and why.

    ``chain`` lists wait-for edges from the blocked ranks to the root cause; ``evidence``
    holds every rank's state (in-flight op or section, dead, idle) and heartbeat facts.
    """
    h = job_diagnosis(request.app, store, session, job).hang
    return _jsonable({
        "job": h.job, "stalled": h.stalled, "stalled_since_ns": h.stalled_since_ns,
        "stalled_for_s": round(h.stalled_for_s, 3), "threshold_s": h.threshold_s,
        "last_step": h.last_step, "culprits": list(h.culprits),
        "hang_class": h.hang_class.value if h.hang_class else None, "group_id": h.group_id,
        "chain": [list(e) for e in h.chain], "evidence": h.evidence,
    })
