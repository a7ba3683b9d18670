"""Runtime control: ``GET``/``PUT /jobs/{job}/instrumentation``.

``PUT {"level": "off" | "steps" | "sections" | "full", "ranks": [...]}`` sets the level
the hooks of a job run at, for every rank (no ``ranks``; clears per-rank settings) or
for the ranks listed. Agents fetch it and pass it to the hooks through the spool
(``fleetscope.control``), so it takes effect within a few seconds without the trainer
making any network call. Changing it is an operator action (admin scope).
"""

from __future__ import annotations

import json
import time
from typing import Literal

from fastapi import APIRouter, HTTPException
from fleetscope.server.api.deps import SessionDep
from fleetscope.server.db.instrumentation_models import Instrumentation
from fleetscope.server.db.models import Job
from pydantic import BaseModel, Field

from fleetscope.control import LEVELS

router = APIRouter(tags=["instrumentation"])

MAX_RANKS_PER_REQUEST = 1 << 16
Level = Literal["off", "steps", "sections", "full"]


class InstrumentationUpdate(BaseModel):
    level: Level = Field(description=f"one of {', '.join(LEVELS)}")
    ranks: list[int] | None = Field(
        default=None, max_length=MAX_RANKS_PER_REQUEST,
        description="global ranks to set; omitted: every rank (per-rank settings cleared)")


class InstrumentationPublic(BaseModel):
    job: str
    level: Level
    ranks: dict[str, Level] = Field(default_factory=dict, description="per-rank overrides")
    version: int = Field(description="grows with every change")
    updated_ns: int = 0


def _public(job: str, row: Instrumentation | None) -> dict:
    if row is None:
        return {"job": job, "level": "full", "ranks": {}, "version": 0, "updated_ns": 0}
    return {"job": job, "level": row.level, "ranks": json.loads(row.ranks or "{}"),
            "version": row.version, "updated_ns": row.updated_ns}


@router.get("/jobs/{job}/instrumentation", response_model=InstrumentationPublic)
def get_instrumentation(job: str, session: SessionDep) -> dict:
    """The level the job's hooks should run at (``full`` unless changed)."""
    return _public(job, session.get(Instrumentation, job))


@router.put("/jobs/{job}/instrumentation", response_model=InstrumentationPublic)
def put_instrumentation(job: str, body: InstrumentationUpdate, session: SessionDep) -> dict:
    """Set the instrumentation level of a job, or of some of its ranks."""
    known = session.get(Job, job)
    if known is None:
        raise HTTPException(404, detail=f"job {job!r} not found")
    world = known.dp * known.tp * known.pp
    bad = [r for r in body.ranks or () if not 0 <= r < world]
    if bad:
        raise HTTPException(422, detail=f"ranks: {bad[:5]} outside the job's world size {world}")
    row = session.get(Instrumentation, job)
    if row is None:
        row = Instrumentation(job=job, level="full", ranks="{}", version=0)
        session.add(row)
    if body.ranks is None:
        row.level, ranks = body.level, {}
    else:
        ranks = json.loads(row.ranks or "{}")
        ranks.update({str(r): body.level for r in body.ranks})
        ranks = {k: v for k, v in ranks.items() if v != row.level}
    row.ranks = json.dumps(dict(sorted(ranks.items(), key=lambda kv: int(kv[0]))))
    row.version = (row.version or 0) + 1
    row.updated_ns = time.time_ns()
    session.commit()
    return _public(job, row)
