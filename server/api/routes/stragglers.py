"""``GET /jobs/{job}/stragglers``: ranked suspects with kind, score, evidence, est. slowdown."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fleetscope.server.api.deps import SessionDep, StoreDep
from fleetscope.server.api.diagnosis import StragglersOut, latest_verdict
from fleetscope.server.diagnosis.findings import STRAGGLER_KINDS, finding_to_dict

router = APIRouter(tags=["diagnosis"])
KINDS = sorted(k.value for k in STRAGGLER_KINDS)


@router.get("/jobs/{job}/stragglers", response_model=StragglersOut)
def stragglers(
    request: Request,
    job: str,
    store: StoreDep,
    session: SessionDep,
    kind: Annotated[str | None, Query(description=f"only this kind: {' | '.join(KINDS)}")] = None,
    rank: Annotated[int | None, Query(ge=0, description="only findings naming this rank")] = None,
    min_slowdown: Annotated[float, Query(ge=0, description="only est. slowdown >= this fraction")] = 0.0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict:
    """Straggling ranks and slow links of the job's latest window, biggest slowdown first."""
    if kind is not None and kind not in KINDS:
        from fastapi import HTTPException

        raise HTTPException(422, detail=f"kind {kind!r}: expected one of {KINDS}")
    d = latest_verdict(request.app, store, session, job)
    items = [f for f in d.findings if f.kind in STRAGGLER_KINDS]
    if kind:
        items = [f for f in items if f.kind.value == kind]
    if rank is not None:
        items = [f for f in items if rank in f.ranks]
    items = [f for f in items if f.est_slowdown >= min_slowdown]
    return {"job": job, "computed_ns": d.computed_ns, "total": len(items), "offset": offset,
            "limit": limit, "items": [finding_to_dict(f) for f in items[offset:offset + limit]]}
