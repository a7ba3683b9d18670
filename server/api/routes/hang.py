"""``GET /jobs/{job}/hang``: current hang analysis (stalled since, culprits, class, chain)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fleetscope.server.api.deps import SessionDep, StoreDep
from fleetscope.server.api.diagnosis import HangOut, latest_verdict
from fleetscope.server.diagnosis.findings import hang_to_dict

router = APIRouter(tags=["diagnosis"])


@router.get("/jobs/{job}/hang", response_model=HangOut)
def hang(request: Request, job: str, store: StoreDep, session: SessionDep) -> dict:
    """Is the job stalled; if so which ranks are the culprits and why.

    ``chain`` lists wait-for edges from the blocked ranks to the root cause; ``evidence``
    holds every rank's state (in-flight op or section, dead, idle) and heartbeat facts.
    """
    d = hang_to_dict(latest_verdict(request.app, store, session, job).hang)
    d.pop("due_in_s", None)
    return d
