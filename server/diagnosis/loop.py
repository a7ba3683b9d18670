"""The diagnosis loop: a server background service.

Every ``diagnosis_tick_s`` it picks the active jobs (running, or failed recently), up
to ``diagnosis_max_jobs_per_tick`` of them round-robin, loads a bounded window of each
(:mod:`.loader`), runs the detectors (:mod:`.engine`) in a worker thread, syncs the
incidents (:mod:`.incidents`), queues alert notifications in the SQL outbox and wakes
the alert dispatcher at once. The latest result per job is kept for the RCA routes.

A pass also learns when each job's stall rules would fire if nothing progresses (the
hang analysis' ``due_in_s``); the loop wakes at that moment for just those jobs instead
of finding the hang up to one tick late.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fleetscope.server.alerts.outbox import enqueue_incident
from fleetscope.server.alerts.rules import install_defaults
from fleetscope.server.db.models import Job
from sqlalchemy import or_, select

from fleetscope.topology import Topology

from .engine import DiagnosisConfig, JobDiagnosis, JobInfo, diagnose
from .hangs import HangConfig
from .incidents import sync_incidents
from .loader import load_job_frames
from .periodic import PeriodicAlertingService
from .stragglers import StragglerConfig

log = logging.getLogger(__name__)

RECENT_FAILED_S = 600.0
MIN_RECHECK_S = 0.25
"""Shortest gap between two early passes of one job (a stall due while its data is still
on the way is re-checked this often)."""


def config_from_settings(settings: Any) -> DiagnosisConfig:
    """Detector thresholds from the server settings (defaults where a field is absent)."""
    g = lambda name, default: getattr(settings, name, default)  # noqa: E731
    return DiagnosisConfig(
        stragglers=StragglerConfig(window_steps=int(g("diagnosis_window_steps", 24))),
        hang=HangConfig(hang_min_s=float(g("hang_min_s", 30.0)), hang_k=float(g("hang_k", 5.0)),
                        hang_op_min_s=float(g("hang_op_min_s", 20.0))),
    )


def job_info(row: Job) -> JobInfo:
    return JobInfo(
        job=row.id, topology=Topology(dp=row.dp, tp=row.tp, pp=row.pp, order=row.order or "tp-dp-pp"),
        num_microbatches=row.num_microbatches or 1, model_flops_per_step=row.model_flops_per_step or 0.0,
        device_peak_flops=row.device_peak_flops or 0.0, status=row.status, start_ns=row.start_ns or 0,
    )


def diagnose_job(store: Any, info: JobInfo, now_ns: int, config: DiagnosisConfig) -> JobDiagnosis:
    """Load one job's window from the store and run every detector on it."""
    frames = load_job_frames(store, info.job, now_ns, window_steps=config.stragglers.window_steps)
    return diagnose(info, frames, now_ns, config)


class DiagnosisLoop(PeriodicAlertingService):
    """Incremental per-job diagnosis with bounded work per tick."""

    name = "fleetscope-diagnosis"

    def __init__(self, app: Any) -> None:
        s = app.state.settings
        super().__init__(app, float(getattr(s, "diagnosis_tick_s", 2.0)))
        self.max_jobs = int(getattr(s, "diagnosis_max_jobs_per_tick", 8))
        self.resolve_after_s = float(getattr(s, "incident_resolve_s", 20.0))
        self.base_url = str(getattr(s, "public_url", "") or "")
        self.config = config_from_settings(s)
        self.latest: dict[str, JobDiagnosis] = {}
        self.num_ticks = 0
        self.num_early_passes = 0
        self._cursor = 0
        self._due_ns: dict[str, int] = {}
        """job -> wall time at which its stall rules may fire (early pass then)."""

    async def prepare(self) -> None:
        await asyncio.to_thread(self._install_defaults)
        self.app.state.diagnosis = self

    def _install_defaults(self) -> None:
        with self.app.state.db() as s:
            install_defaults(s)

    def active_jobs(self, now_ns: int) -> list[Job]:
        with self.app.state.db() as s:
            rows = list(s.scalars(select(Job).where(or_(
                Job.status == "running",
                Job.updated_ns >= now_ns - int(RECENT_FAILED_S * 1e9),
            )).order_by(Job.id)))
        return rows

    def tick(self) -> int:
        """One pass over up to ``max_jobs`` active jobs; returns alert rows queued."""
        now = time.time_ns()
        jobs = self.active_jobs(now)
        if not jobs:
            return 0
        n = min(self.max_jobs, len(jobs))
        picked = [jobs[(self._cursor + i) % len(jobs)] for i in range(n)]
        self._cursor = (self._cursor + n) % max(len(jobs), 1)
        picked += [j for j in jobs if j not in picked and self._due_ns.get(j.id, now + 1) <= now]
        active = {j.id for j in jobs}
        self._due_ns = {k: v for k, v in self._due_ns.items() if k in active}
        queued = self._run_jobs(picked, now)
        self.num_ticks += 1
        return queued

    def due_in_s(self) -> float:
        if not self._due_ns:
            return float("inf")
        return (min(self._due_ns.values()) - time.time_ns()) / 1e9

    def tick_due(self) -> int:
        """Early pass over the jobs whose stall threshold is due now."""
        now = time.time_ns()
        due = {k for k, v in self._due_ns.items() if v <= now + 20_000_000}
        if not due:
            return 0
        picked = [j for j in self.active_jobs(now) if j.id in due][: self.max_jobs]
        for k in due - {j.id for j in picked}:
            self._due_ns.pop(k, None)
        self.num_early_passes += 1
        return self._run_jobs(picked, now)

    def _run_jobs(self, rows: list[Job], now_ns: int) -> int:
        queued = 0
        for row in rows:
            try:
                queued += self.run_job(row, now_ns)
            except Exception:
                self._due_ns.pop(row.id, None)
                log.exception("diagnosis of job %s failed", row.id)
        return queued

    def run_job(self, row: Job, now_ns: int) -> int:
        info = job_info(row)
        result = diagnose_job(self.app.state.store, info, now_ns, self.config)
        self.latest[info.job] = result
        due = result.hang.due_in_s
        if due is None or info.status == "finished":
            self._due_ns.pop(info.job, None)
        else:
            self._due_ns[info.job] = time.time_ns() + int(max(due, MIN_RECHECK_S) * 1e9)
        finished = info.status == "finished"
        with self.app.state.db() as s:
            findings = [] if finished else result.findings
            changes = sync_incidents(s, info.job, findings, now_ns, self.resolve_after_s,
                                     job_finished=finished)
            queued = 0
            for ch in changes:
                if ch.what in ("opened", "updated", "resolved"):
                    queued += enqueue_incident(s, ch.incident, time.time_ns(), self.base_url)
        if queued:  # deliver now, not after the rest of this pass
            dispatcher = getattr(self.app.state, "alert_dispatcher", None)
            if dispatcher is not None:
                dispatcher.wake()
        return queued


def diagnosis_loop(app: Any) -> Any:
    """Service factory for :data:`fleetscope.server.services.SERVICES`."""
    if not getattr(app.state.settings, "diagnosis_enabled", True):
        from fleetscope.server.alerts.service import DisabledService

        return DisabledService()
    return DiagnosisLoop(app)
