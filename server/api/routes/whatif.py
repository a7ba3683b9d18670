"""``GET /jobs/{job}/whatif?rank=…&group=…``: step time if ranks/links ran at their peers' median."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fleetscope.server.api.deps import SessionDep, StoreDep
from fleetscope.server.api.diagnosis import WhatIfOut, get_job, job_diagnosis
from fleetscope.server.diagnosis.whatif import whatif as run_whatif

router = APIRouter(tags=["diagnosis"])


@router.get("/jobs/{job}/whatif", response_model=WhatIfOut)
def whatif(
    request: Request, job: str, store: StoreDep, session: SessionDep,
    rank: Annotated[list[int], Query(description="rank(s) to set to their stage peers' median")] = [],  # noqa: B006
    group: Annotated[str, Query(description="group id whose link time is set to the median of its axis' groups at its stage, e.g. tp.pp0.dp1")] = "",
) -> dict:
    """Replays the job's latest window through the 1F1B schedule and TP/DP sync points."""
    row = get_job(session, job)
    world = row.dp * row.tp * row.pp
    bad = [r for r in rank if not 0 <= r < world]
    if bad:
        raise HTTPException(422, detail=f"rank {bad[0]} out of range [0, {world})")
    if not rank and not group:
        raise HTTPException(422, detail="give at least one rank= or group=")
    d = job_diagnosis(request.app, store, session, job)
    if d.profile is None:
        raise HTTPException(409, detail=f"job {job!r} has no complete steps yet")
    if group:
        try:
            d.profile.topology.parse_group_id(group)
        except ValueError as e:
            raise HTTPException(422, detail=f"group {group!r}: {e}") from None
    w = run_whatif(d.profile, ranks=rank or None, group_id=group)
    bd = d.breakdown
    steps = sorted(bd["step"].unique())[-8:] if not bd.empty else []
    observed = float(bd[bd["step"].isin(steps)].groupby("step")["step_ns"].max().median()) if len(steps) else 0.0
    return {"job": job, "ranks": rank, "group_id": group, "observed_step_ms": round(observed / 1e6, 3),
            "predicted_step_ms": round(w.predicted_step_ns / 1e6, 3),
            "step_ms_if_fixed": round(w.fixed_step_ns / 1e6, 3), "est_slowdown": round(w.slowdown, 4),
            "model": "1f1b pipeline schedule + TP/DP sync points"}
