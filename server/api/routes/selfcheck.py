"""Self-check results: ``GET /selfcheck/hosts``, ``GET /hosts/{host}/selfcheck`` and
``GET /jobs/{job}/preflight``.

Probe results arrive through ``POST /ingest`` as ``probes`` records (from
``fleetscope selfcheck`` and ``fleetscope train --preflight``); these routes score them
against the fleet and each device's history (:mod:`fleetscope.server.diagnosis.selfcheck`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query
from fleetscope.server.api.deps import StoreDep
from fleetscope.server.diagnosis import selfcheck, selfcheck_report

router = APIRouter(tags=["selfcheck"])

WindowQ = Annotated[
    float,
    Query(gt=0, le=366 * 86400, description="only results newer than this many seconds"),
]


_DEFAULTS = selfcheck.ScoringConfig()
MinRatioQ = Annotated[float, Query(
    gt=0, lt=1, description="outlier below this fraction of the fleet median")]
ZQ = Annotated[float, Query(gt=0, le=100, description="... and below this robust z-score")]


def _config(min_ratio: float, z_threshold: float) -> selfcheck.ScoringConfig:
    return selfcheck.ScoringConfig(min_ratio=min_ratio, z_threshold=z_threshold)


@router.get("/selfcheck/hosts")
def selfcheck_hosts(
    store: StoreDep,
    window_s: WindowQ = selfcheck.DEFAULT_WINDOW_S,
    history: Annotated[
        int, Query(ge=0, le=100, description="earlier results per probe for the history score")
    ] = 5,
    device_model: Annotated[
        str | None, Query(max_length=200, description="only this device model")
    ] = None,
    min_ratio: MinRatioQ = _DEFAULTS.min_ratio,
    z_threshold: ZQ = _DEFAULTS.z_threshold,
) -> dict[str, Any]:
    """Every host's self-check status (worst first) and all findings, worst first.

    A host's status is the worst of its probes': ``failed`` (a probe failed its own
    checks), ``mismatch`` (numerics differ from the fleet), ``outlier`` (slower than the
    fleet's devices of the same model), ``regressed`` (slower than its own history), ``ok``.
    """
    return selfcheck.fleet_summary(
        store, window_s=window_s, history=history, device_model=device_model or None,
        config=_config(min_ratio, z_threshold),
    )


@router.get("/hosts/{host}/selfcheck", responses={404: {"description": "no probe results"}})
def host_selfcheck(
    store: StoreDep,
    host: Annotated[str, Path(min_length=1, max_length=255)],
    window_s: WindowQ = selfcheck.DEFAULT_WINDOW_S,
    history: Annotated[int, Query(ge=0, le=100)] = 10,
    min_ratio: MinRatioQ = _DEFAULTS.min_ratio,
    z_threshold: ZQ = _DEFAULTS.z_threshold,
) -> dict[str, Any]:
    """One host's latest probe results with fleet and history scores, and its findings."""
    summary = selfcheck.host_summary(store, host, window_s=window_s, history=history,
                                     config=_config(min_ratio, z_threshold))
    if summary is None:
        raise HTTPException(
            404, detail=f"host {host!r} has no self-check results in the last {window_s:g}s"
        )
    return summary


@router.get("/jobs/{job}/preflight", responses={404: {"description": "no preflight results"}})
def job_preflight(
    store: StoreDep, job: Annotated[str, Path(min_length=1, max_length=255)]
) -> dict[str, Any]:
    """Which hosts of a job passed its preflight self-check (``fleetscope train --preflight``)."""
    from fleetscope.server.store import probe_queries

    rows = probe_queries.job_probes(store, job)
    if not rows:
        raise HTTPException(404, detail=f"job {job!r} has no preflight/self-check results")
    return {"job": job, **selfcheck_report.job_preflight(rows)}
