"""``GET /jobs/{job}/mfu``: MFU per step and per job, and a sustained decline if any."""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fleetscope.server.api.deps import SessionDep, StoreDep
from fleetscope.server.api.diagnosis import MfuOut, get_job, job_diagnosis
from fleetscope.server.diagnosis.findings import FindingKind, finding_to_dict

router = APIRouter(tags=["diagnosis"])


def _num(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


@router.get("/jobs/{job}/mfu", response_model=MfuOut)
def mfu(
    request: Request, job: str, store: StoreDep, session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=10_000, description="latest steps returned")] = 120,
) -> dict:
    """MFU = model FLOPs per step / (step time x world size x device peak FLOP/s).

    Without a declared device peak (CPU runs) ``mfu`` is null and ``flops_per_s`` (achieved)
    carries the same information; ``decline`` is the change-point finding, if any.
    """
    row = get_job(session, job)
    d = job_diagnosis(request.app, store, session, job)
    s = d.mfu.tail(limit)
    decline = next((f for f in d.findings if f.kind == FindingKind.MFU_DROP), None)
    return {
        "job": job, "model_flops_per_step": row.model_flops_per_step,
        "device_peak_flops": row.device_peak_flops,
        "mfu": _num(float(s["mfu"].median())) if len(s) else None,
        "flops_per_s": _num(float(s["flops_per_s"].median())) if len(s) else None,
        "decline": finding_to_dict(decline) if decline else None,
        "steps": [{"step": int(r.step), "step_s": float(r.step_s), "flops_per_s": _num(r.flops_per_s),
                   "mfu": _num(r.mfu)} for r in s.itertuples(index=False)],
    }
