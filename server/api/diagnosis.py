"""Glue for the RCA routes: their pydantic models and the per-job verdict they answer.

``/stragglers`` and ``/hang`` call :func:`latest_verdict` (the diagnosis loop's latest
verdict, from this process or published by a worker); ``/whatif`` and ``/mfu`` call
:func:`job_diagnosis`, which reuses the loop's latest result when it is fresh, else runs
one pass on demand.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import HTTPException
from fleetscope.server.db.models import Job
from fleetscope.server.diagnosis.engine import JobDiagnosis
from fleetscope.server.diagnosis.findings import Finding, HangAnalysis
from fleetscope.server.diagnosis.loop import config_from_settings, diagnose_job, job_info
from pydantic import BaseModel, ConfigDict, Field

FINDING_EXAMPLE: dict[str, Any] = {
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


@dataclass(frozen=True)
class Verdict:
    """A diagnosis pass's findings and hang analysis (what ``/stragglers`` and ``/hang``
    answer): the in-process loop's, a worker's (:func:`publish`), or an on-demand pass's."""

    job: str
    computed_ns: int
    findings: list[Finding]
    hang: HangAnalysis
    took_s: float = 0.0


MAX_PUBLISHED_JOBS = 1024
"""Jobs whose latest worker verdict one server process keeps (the oldest go first)."""


def publish(app: Any, verdict: Verdict) -> None:
    """Keep a worker's latest verdict of a job (an older one than kept is ignored)."""
    with _PUBLISH:
        kept = app.state.published_verdicts
        old = kept.get(verdict.job)
        if old is not None and old.computed_ns > verdict.computed_ns:
            return
        kept.pop(verdict.job, None)
        kept[verdict.job] = verdict
        while len(kept) > MAX_PUBLISHED_JOBS:
            kept.pop(next(iter(kept)))


def latest_verdict(app: Any, store: Any, session: Any, job: str) -> Verdict | JobDiagnosis:
    """The diagnosis loop's latest verdict of ``job``: where the loop runs in a worker
    process, the one it published, while it is fresh (within the API's freshness window,
    or twice the worker's pass time plus two ticks when its passes are slow), so the API
    answers what the incidents say and no second pass competes with the worker's;
    otherwise :func:`job_diagnosis`."""
    if app.state.diagnosis is None:
        get_job(session, job)
        kept = app.state.published_verdicts.get(job)
        if kept is not None:
            tick = float(app.state.settings.diagnosis_tick_s)
            fresh_s = max(2.5 * tick, 2.0 * kept.took_s + 2.0 * tick)
            if time.time_ns() - kept.computed_ns <= fresh_s * 1e9:
                return kept
    return job_diagnosis(app, store, session, job)


def job_diagnosis(app: Any, store: Any, session: Any, job: str, max_age_s: float | None = None) -> JobDiagnosis:
    """The loop's latest diagnosis of ``job`` if fresh, else a new pass now.

    With the loop in a worker process, this process runs its own passes on demand, at
    most one per job at a time: a request that arrives while one runs waits for it
    instead of starting another (many clients polling a job whose pass takes longer than
    ``max_age`` - a loaded server, a large job - used to pile up passes), and a result
    stays fresh for at least twice the time its pass took, so polling spends at most about
    a third of a core on each job however slow its passes are."""
    row = get_job(session, job)
    loop = app.state.diagnosis
    settings = app.state.settings
    max_age = max_age_s if max_age_s is not None else 2.5 * float(settings.diagnosis_tick_s)
    if loop is not None:  # the loop runs in this process: its results
        cached = loop.latest.get(job)
        if cached is not None and time.time_ns() - cached.computed_ns <= max_age * 1e9:
            return cached
        return _pass(app, store, row, cached)
    od: OnDemand = app.state.diagnosis_on_demand
    while True:
        with od.lock:
            cached = od.latest.get(job)
            fresh = max(max_age, 2.0 * od.took_s.get(job, 0.0))
            if cached is not None and time.time_ns() - cached.computed_ns <= fresh * 1e9:
                return cached
            running = od.running.get(job)
            if running is None:
                running = od.running[job] = threading.Event()
                break
        running.wait(_WAIT_S)  # another request's pass of this job: its result
    t0 = time.monotonic()
    try:
        result = _pass(app, store, row, cached)
        with od.lock:
            od.latest.pop(job, None)
            od.latest[job] = result
            od.took_s[job] = time.monotonic() - t0
            while len(od.latest) > _ON_DEMAND_JOBS:  # bounded: the oldest entries go first
                gone = next(iter(od.latest))
                od.latest.pop(gone)
                od.took_s.pop(gone, None)
        return result
    finally:
        with od.lock:
            od.running.pop(job).set()


_ON_DEMAND_JOBS = 64
"""Jobs whose latest on-demand diagnosis one server process keeps."""
_WAIT_S = 30.0
"""How often a request waiting for another request's pass looks again."""


def _pass(app: Any, store: Any, row: Job, previous: JobDiagnosis | None) -> JobDiagnosis:
    collector = app.state.collector
    host_seen = dict(collector.host_seen_ns) if collector is not None else {}
    job_seen = int(collector.job_seen_ns.get(row.id, 0)) if collector is not None else 0
    # an on-demand pass keeps the hang culprits the loop named (what the incident says)
    return diagnose_job(store, job_info(row), time.time_ns(), config_from_settings(app.state.settings),
                        host_seen, previous=previous.hang if previous is not None else None,
                        job_seen_ns=job_seen)


@dataclass
class OnDemand:
    """This process' own passes (the loop runs in a worker process)."""

    latest: dict[str, JobDiagnosis] = field(default_factory=dict)
    took_s: dict[str, float] = field(default_factory=dict)
    running: dict[str, threading.Event] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_PUBLISH = threading.Lock()
