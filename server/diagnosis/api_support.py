"""Glue for the RCA routes: pydantic models and cached per-job diagnosis.

Routes call :func:`job_diagnosis`, which reuses the diagnosis loop's latest result
for the job when it is fresh, else runs one pass on demand.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import HTTPException
from fleetscope.server.db.models import Job
from pydantic import BaseModel, ConfigDict, Field

from .engine import JobDiagnosis
from .loop import config_from_settings, diagnose_job, job_info

FINDING_EXAMPLE = {
    "kind": "slow_compute", "job": "demo", "ranks": [5], "score": 4.2,
    "summary": "rank 5 (r5 pp1 dp0 tp1): compute 1.50x its stage peers; job ~19% slower", "severity": "warning",
    "hosts": ["node-1"], "group_id": "", "first_step": 10, "last_step": 41, "est_slowdown": 0.19,
    "factor": 1.5, "component": "compute",
    "key": "slow_compute:5",
    "evidence": {"busy_ms": 131.2, "peer_busy_ms": 100.1, "components_excess_ms": {"compute": 30.9},
                 "last_arrival_frac": 0.92, "predicted_step_ms": 206.4, "step_ms_if_fixed": 172.9,
                 "slowdown_model": "1f1b what-if"},
}


class FindingOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [FINDING_EXAMPLE]})
    kind: str
    job: str
    ranks: list[int] = Field(description="culprit ranks first")
    score: float
    summary: str
    severity: str
    hosts: list[str]
    group_id: str
    first_step: int
    last_step: int
    est_slowdown: float = Field(description="estimated fractional job slowdown (0.1 = 10%)")
    factor: float = Field(0.0, description="stragglers: the slow component's time / its peers' "
                                           "(median per-step ratio since onset; 1.5 = 50% longer); 0: n/a")
    component: str = Field("", description="what factor measures: compute, data loading, optimizer, "
                                           "untimed host work, own work, <axis> link")
    key: str
    evidence: dict[str, Any]


class StragglersOut(BaseModel):
    job: str
    computed_ns: int
    total: int
    offset: int
    limit: int
    items: list[FindingOut]


class HangOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "job": "demo", "stalled": True, "stalled_since_ns": 1764460800000000000, "stalled_for_s": 41.5,
        "threshold_s": 30.0, "last_step": 19, "culprits": [3], "hang_class": "stuck_in_compute",
        "group_id": "", "chain": [[2, 3, "all_reduce tp.pp0.dp1#161: rank 3 never arrived (in section forward)"]],
        "evidence": {"blocked_ranks": [0, 1, 2, 4, 5, 6, 7], "dead_ranks": []}}]})
    job: str
    stalled: bool
    stalled_since_ns: int
    stalled_for_s: float
    threshold_s: float
    last_step: int
    culprits: list[int]
    hang_class: str | None
    group_id: str
    chain: list[list[Any]] = Field(description="wait-for edges [waiter, waited_for, reason]")
    evidence: dict[str, Any]


class MfuPoint(BaseModel):
    step: int
    step_s: float
    flops_per_s: float | None
    mfu: float | None


class MfuOut(BaseModel):
    job: str
    model_flops_per_step: float
    device_peak_flops: float
    mfu: float | None = Field(description="job MFU over the returned steps (median); null without a device peak")
    flops_per_s: float | None
    decline: FindingOut | None
    steps: list[MfuPoint]


class WhatIfOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "job": "demo", "ranks": [5], "group_id": "", "observed_step_ms": 207.0,
        "predicted_step_ms": 206.4, "step_ms_if_fixed": 172.9, "est_slowdown": 0.194,
        "model": "1f1b pipeline schedule + TP/DP sync points"}]})
    job: str
    ranks: list[int]
    group_id: str
    observed_step_ms: float
    predicted_step_ms: float
    step_ms_if_fixed: float
    est_slowdown: float
    model: str


def get_job(session: Any, job: str) -> Job:
    row = session.get(Job, job)
    if row is None:
        raise HTTPException(404, detail=f"job {job!r} not found")
    return row


def job_diagnosis(app: Any, store: Any, session: Any, job: str, max_age_s: float | None = None) -> JobDiagnosis:
    """The loop's latest diagnosis of ``job`` if fresh, else a new pass now."""
    row = get_job(session, job)
    loop = getattr(app.state, "diagnosis", None)
    settings = app.state.settings
    max_age = max_age_s if max_age_s is not None else 2.5 * float(getattr(settings, "diagnosis_tick_s", 2.0))
    now = time.time_ns()
    # the loop's results (diagnosis in this process), else this process' own recent passes
    # (the loop runs in a worker process): one on-demand pass per job per max_age
    latest = loop.latest if loop is not None else _on_demand(app)
    cached = latest.get(job)
    if cached is not None and now - cached.computed_ns <= max_age * 1e9:
        return cached
    collector = getattr(app.state, "collector", None)
    # an on-demand pass keeps the hang culprits the loop named (what the incident says)
    result = diagnose_job(store, job_info(row), now, config_from_settings(settings),
                          dict(getattr(collector, "host_seen_ns", None) or {}),
                          previous=cached.hang if cached is not None else None)
    if loop is None:
        latest[job] = result
        while len(latest) > 64:  # bounded: the oldest entries go first
            latest.pop(next(iter(latest)))
    return result


def _on_demand(app: Any) -> dict[str, JobDiagnosis]:
    d = getattr(app.state, "diagnosis_on_demand", None)
    if d is None:
        d = app.state.diagnosis_on_demand = {}
    return d
