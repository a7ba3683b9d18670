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
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from fleetscope.server.db import leases
from fleetscope.server.db.models import Job
from sqlalchemy import or_, select, update

from fleetscope.topology import Topology

from .engine import DiagnosisConfig, JobDiagnosis, JobInfo, diagnose, diagnose_hang
from .findings import FindingKind
from .hangs import HangConfig
from .incidents import IncidentSink, sync_incidents
from .loader import load_reduced_frames
from .periodic import PeriodicAlertingService
from .rollups import StepCache
from .stragglers import StragglerConfig

log = logging.getLogger(__name__)

RECENT_FAILED_S = 600.0
LIVE_STATUSES = ("running", "lost")
"""Statuses of jobs diagnosed every tick (``lost``: nothing arrived for silent_s)."""
_DEFAULT_CACHE = StepCache(max_jobs=4)
"""Step reductions of on-demand passes (RCA routes without a fresh loop result)."""
SETTLED_EVERY_TICKS = 5
"""A failed job whose hang diagnosis came out the same in SETTLED_AFTER_PASSES full passes
in a row is re-diagnosed every this many ticks (its processes are gone; a full pass of it
must not delay the live jobs' passes)."""
SETTLED_AFTER_PASSES = 3
POST_MORTEM_SKIP = frozenset({FindingKind.HANG, FindingKind.HEARTBEAT_LOST})
"""Finding kinds the final pass of a finished job does not record (its processes exited)."""
MIN_RECHECK_S = 0.25
"""Shortest gap between two early passes of one job (a stall due while its data is still
on the way is re-checked this often)."""


class DiagnosisSettings(Protocol):
    """The server settings the detectors read (:class:`fleetscope.server.settings.Settings`)."""

    diagnosis_window_steps: int
    hang_min_s: float
    hang_first_step_min_s: float
    hang_k: float
    hang_op_min_s: float
    silent_s: float


def config_from_settings(settings: DiagnosisSettings) -> DiagnosisConfig:
    """Detector thresholds from the server settings (whose defaults are the detectors')."""
    return DiagnosisConfig(
        stragglers=StragglerConfig(window_steps=settings.diagnosis_window_steps),
        hang=HangConfig(hang_min_s=settings.hang_min_s, first_step_min_s=settings.hang_first_step_min_s,
                        hang_k=settings.hang_k,
                        hang_op_min_s=settings.hang_op_min_s),
        silent_s=settings.silent_s,
    )


def job_info(row: Job) -> JobInfo:
    return JobInfo(
        job=row.id, topology=Topology(dp=row.dp, tp=row.tp, pp=row.pp, order=row.order or "tp-dp-pp"),
        num_microbatches=row.num_microbatches or 1, model_flops_per_step=row.model_flops_per_step or 0.0,
        device_peak_flops=row.device_peak_flops or 0.0, status=row.status, start_ns=row.start_ns or 0,
    )


def diagnose_job(store: Any, info: JobInfo, now_ns: int, config: DiagnosisConfig,
                 host_seen_ns: dict[str, int] | None = None, cache: StepCache | None = None,
                 previous: Any = None, job_seen_ns: int = 0) -> JobDiagnosis:
    """Load one job's window, reduced by the store (:mod:`.rollups`), and run every detector
    (``previous``: the job's previous hang analysis, for culprit stickiness)."""
    frames = load_reduced_frames(store, info.job, now_ns, cache if cache is not None else _DEFAULT_CACHE,
                                 info.topology.world_size, info.num_microbatches,
                                 window_steps=config.stragglers.window_steps, started_ns=info.start_ns)
    frames.host_seen_ns = dict(host_seen_ns or {})
    frames.job_seen_ns = job_seen_ns
    return diagnose(info, frames, now_ns, config, previous)


class DiagnosisLoop(PeriodicAlertingService):
    """Incremental per-job diagnosis with bounded work per tick."""

    name = "fleetscope-diagnosis"

    def __init__(self, app: Any, sink: IncidentSink, lease_owner: str | None = None) -> None:
        s = app.state.settings
        self.sink = sink
        """Changed incidents go here (the alert outbox, given by the composition root)."""
        super().__init__(app, float(s.diagnosis_tick_s))
        self.max_jobs = int(s.diagnosis_max_jobs_per_tick)
        self.cache = StepCache(int(s.diagnosis_cache_jobs))
        self.concurrency = int(s.diagnosis_concurrency)
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="fleetscope-diag")
        self.lease_owner = lease_owner
        """Set in a worker process: every pass first claims the job's lease in the SQL DB."""
        self.lease_s = max(30.0, 5 * float(s.diagnosis_tick_s))
        self.pass_s: dict[str, float] = {}
        """job -> duration of its latest full pass (s)."""
        self.resolve_after_s = float(s.incident_resolve_s)
        self.config = config_from_settings(s)
        self.latest: dict[str, JobDiagnosis] = {}
        self.on_result: Callable[[JobDiagnosis, float], None] | None = None
        """Called with each full pass's result and its duration (a worker publishes it)."""
        self.num_ticks = 0
        self.num_early_passes = 0
        self._cursor = 0
        self._due_ns: dict[str, int] = {}
        """job -> wall time at which its stall rules may fire (early pass then)."""
        self._same_hang: dict[str, tuple[tuple, int]] = {}
        """job -> (its latest hang verdict, how many full passes in a row gave it)."""
        self._last_tick: dict[str, int] = {}
        """job -> ``num_ticks`` at its latest full pass."""
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._closed: dict[str, int] = {}
        """finished job -> its ``updated_ns`` when its incidents were resolved."""

    async def prepare(self) -> None:
        await asyncio.to_thread(self._install_defaults)
        self.app.state.diagnosis = self

    async def stop(self) -> None:
        await super().stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def release_leases(self) -> None:
        if self.lease_owner:
            with self.app.state.db() as s:
                leases.release_all(s, self.lease_owner)

    def _claim(self, job: str) -> bool:
        """This process may diagnose ``job`` now (always, without a lease owner)."""
        if not self.lease_owner:
            return True
        with self.app.state.db() as s:
            return leases.claim(s, job, self.lease_owner, time.time_ns(), self.lease_s)

    def _install_defaults(self) -> None:
        with self.app.state.db() as s:
            self.sink.install(s)

    def active_jobs(self, now_ns: int) -> list[Job]:
        with self.app.state.db() as s:
            rows = list(s.scalars(select(Job).where(or_(
                Job.status.in_(LIVE_STATUSES),
                Job.updated_ns >= now_ns - int(RECENT_FAILED_S * 1e9),
            )).order_by(Job.id)))
        return rows

    def tick(self) -> int:
        """One pass over up to ``max_jobs`` live jobs (running ones first); returns alert rows
        queued. A finished job only has its incidents resolved, once."""
        now = time.time_ns()
        jobs = self.active_jobs(now)
        by_id = {j.id: j for j in jobs}
        for k in [k for k in list(self._due_ns) if k not in by_id]:  # in place: the early pass writes too
            self._due_ns.pop(k, None)
        self._closed = {k: v for k, v in self._closed.items() if k in by_id}
        self._last_tick = {k: v for k, v in self._last_tick.items() if k in by_id}
        self._same_hang = {k: v for k, v in self._same_hang.items() if k in by_id}
        queued = 0
        for j in jobs:
            if j.status == "finished" and self._closed.get(j.id) != j.updated_ns:
                queued += self._guarded(self.close_job, j)
        live = [j for j in jobs if j.status != "finished" and not self._settled(j)]
        if live:
            n = min(self.max_jobs, len(live))
            picked = [live[(self._cursor + i) % len(live)] for i in range(n)]
            self._cursor = (self._cursor + n) % len(live)
            picked.sort(key=lambda j: j.status not in LIVE_STATUSES)  # stable: round-robin order within
            queued += self._run_jobs(picked)
        self.num_ticks += 1
        return queued

    def _settled(self, row: Job) -> bool:
        """A failed job whose hang diagnosis is stable, diagnosed less than
        SETTLED_EVERY_TICKS ago."""
        last = self.latest.get(row.id)
        if row.status != "failed" or last is None or not last.hang.stalled:
            return False
        if self._same_hang.get(row.id, (None, 0))[1] < SETTLED_AFTER_PASSES:
            return False
        return self.num_ticks - self._last_tick.get(row.id, -SETTLED_EVERY_TICKS) < SETTLED_EVERY_TICKS

    def due_in_s(self) -> float:
        due = list(self._due_ns.values())  # one atomic copy: the pass thread updates it
        return (min(due) - time.time_ns()) / 1e9 if due else float("inf")

    def tick_due(self) -> int:
        """Early pass over the jobs whose stall threshold is due now."""
        now = time.time_ns()
        due = {k for k, v in list(self._due_ns.items()) if v <= now + 20_000_000}
        if not due:
            return 0
        by_id = {j.id: j for j in self.active_jobs(now) if j.status != "finished"}
        for k in due - set(by_id):
            self._due_ns.pop(k, None)
        self.num_early_passes += 1
        return self._run_jobs([by_id[k] for k in sorted(due & set(by_id))][: self.max_jobs], full=False)

    def _run_jobs(self, rows: list[Job], full: bool = True) -> int:
        """Diagnose ``rows``: all detectors, or the hang analysis alone; up to
        ``diagnosis_concurrency`` jobs at once (in round-robin order)."""
        fn = self.run_job if full else self.run_hang_job
        if len(rows) <= 1 or self.concurrency <= 1:
            return sum(self._guarded(fn, row) for row in rows)
        return sum(self._pool.map(lambda row: self._guarded(fn, row), rows))

    def _guarded(self, fn: Any, row: Job) -> int:
        """Run ``fn(row)`` unless a pass of the same job runs in the other thread."""
        with self._locks_guard:
            lock = self._locks.setdefault(row.id, threading.Lock())
        if not lock.acquire(blocking=False):  # the two passes never work on one job at once
            if fn == self.run_hang_job:  # look again shortly (the full pass may end first)
                self._due_ns[row.id] = time.time_ns() + int(MIN_RECHECK_S * 1e9)
            return 0
        try:
            if not self._claim(row.id):  # another worker diagnoses this job
                self._due_ns.pop(row.id, None)
                self.cache.drop(row.id)
                return 0
            t0 = time.monotonic()
            queued = fn(row)
            self._count_job_pass("hang_job" if fn == self.run_hang_job else "job", time.monotonic() - t0)
            return queued
        except Exception:
            self._due_ns.pop(row.id, None)
            log.exception("diagnosis of job %s failed", row.id)
            return 0
        finally:
            lock.release()

    @property
    def _store(self) -> Any:
        """The passes' store: the server's diagnosis handle (its own client, queries at
        ``diagnosis_query_nice``) where there is one, else the app's store (a worker's)."""
        st = self.app.state
        return getattr(st, "diagnosis_store", None) or st.store

    def _count_job_pass(self, name: str, took_s: float) -> None:
        """One job's pass in ``pass_seconds`` (``/metrics``: ``pass="job"`` a full pass of
        one job, ``pass="hang_job"`` a hang-only one). The ``tick`` and ``tick_due`` series
        time the loop's rounds, and a round that found its due job locked by the other
        thread's pass, or nothing due, counts there too, in about no time."""
        with self._locks_guard:
            acc = self.pass_seconds.setdefault(name, [0, 0.0, 0.0])
            acc[0], acc[1], acc[2] = acc[0] + 1, acc[1] + took_s, took_s

    def close_job(self, row: Job) -> int:
        """A finished job: one last full pass over its final window (its last steps may have
        arrived after the previous pass, or all at once from an agent that fell behind), then
        resolve its open incidents and queue their resolved alerts.

        A problem the last pass finds that no earlier pass did is recorded as an incident
        (it shows in the job's and the hosts' history) and resolved at once, without paging:
        nobody can act on a job that is over. Hang and heartbeat findings are left out: the
        processes of a finished job are gone by design."""
        now = time.time_ns()
        self._due_ns.pop(row.id, None)
        final: list = []
        try:
            result = diagnose_job(self._store, job_info(row), now, self.config, cache=self.cache)
            self.latest[row.id] = result
            final = [f for f in result.findings if f.kind not in POST_MORTEM_SKIP]
        except Exception:
            log.exception("final diagnosis of job %s failed", row.id)
        with self.app.state.db() as s:
            # one transaction: a reader sees the final findings only once they are resolved
            sync_incidents(s, row.id, final, now, self.resolve_after_s, resolve_missing=False, commit=False)
            changes = sync_incidents(s, row.id, [], now, self.resolve_after_s, job_finished=True)
            # resolved alerts go only where a firing one went: the new ones page nobody
            queued = sum(self.sink.notify(s, ch.incident, now) for ch in changes)
        self._closed[row.id] = row.updated_ns
        self.cache.drop(row.id)
        self._wake_dispatcher(queued)
        return queued

    def run_job(self, row: Job) -> int:
        """Diagnose one job now: incidents, alert rows, when its stall rules are next due."""
        now_ns = time.time_ns()
        info = job_info(row)
        prev = self.latest.get(info.job)
        result = diagnose_job(self._store, info, now_ns, self.config, self._host_seen(),
                              self.cache, prev.hang if prev is not None else None, self._job_seen(info.job))
        self.latest[info.job] = result
        self._set_lost(row, result.findings)
        self._last_tick[info.job] = self.num_ticks
        h = result.hang
        verdict = (h.stalled, h.culprits, h.hang_class, h.group_id)
        prev_verdict, n = self._same_hang.get(info.job, (None, 0))
        self._same_hang[info.job] = (verdict, n + 1 if verdict == prev_verdict else 1)
        self._schedule(info.job, result.hang.due_in_s, now_ns)
        with self.app.state.db() as s:
            changes = sync_incidents(s, info.job, result.findings, now_ns, self.resolve_after_s)
            queued = 0
            for ch in changes:
                if ch.what in ("opened", "updated", "resolved"):
                    queued += self.sink.notify(s, ch.incident, time.time_ns())
        self._wake_dispatcher(queued)
        took_s = (time.time_ns() - now_ns) / 1e9
        self.pass_s[info.job] = took_s
        if self.on_result is not None:
            self.on_result(result, took_s)
        if took_s > self.tick_s:
            log.info("diagnosis pass of job %s took %.1f s (tick %.1f s)", info.job, took_s, self.tick_s)
        return queued

    def run_hang_job(self, row: Job) -> int:
        """The hang analysis alone, for a job whose stall threshold is due: a pass without
        the straggler/what-if/MFU work (most of a full pass), and a hang incident at once."""
        now_ns = time.time_ns()
        info = job_info(row)
        frames = load_reduced_frames(self._store, info.job, now_ns, self.cache, info.topology.world_size,
                                     info.num_microbatches, window_steps=self.config.stragglers.window_steps,
                                     hardware=False, hang_only=True, started_ns=info.start_ns)
        frames.host_seen_ns = self._host_seen()
        frames.job_seen_ns = self._job_seen(info.job)
        cached = self.latest.get(info.job)
        hang, findings = diagnose_hang(info, frames, now_ns, self.config,
                                       cached.hang if cached is not None else None)
        self._schedule(info.job, hang.due_in_s, now_ns)
        if cached is not None:
            cached.hang = hang
            if self.on_result is not None:  # the new hang analysis beside the full pass's findings
                self.on_result(cached, self.pass_s.get(info.job, 0.0))
        findings = [f for f in findings if f.kind == FindingKind.HANG or f.evidence.get("silence")]
        if not findings:
            return 0
        with self.app.state.db() as s:  # hardware evidence joins at the next full pass
            changes = sync_incidents(s, info.job, findings, now_ns, self.resolve_after_s, resolve_missing=False)
            queued = sum(self.sink.notify(s, ch.incident, time.time_ns()) for ch in changes)
        self._wake_dispatcher(queued)
        return queued

    def _set_lost(self, row: Job, findings: list) -> None:
        """``lost`` while nothing arrives from the job (a job-silence finding), ``running``
        again once telemetry resumes."""
        silent = any(f.evidence.get("silence") == "job" for f in findings)
        new = "lost" if silent and row.status == "running" else "running" if not silent and row.status == "lost" else ""
        if not new:
            return
        with self.app.state.db() as s:
            s.execute(update(Job).where(Job.id == row.id, Job.status == row.status).values(status=new))
            s.commit()
        log.warning("job %s: status %s -> %s", row.id, row.status, new)

    def _host_seen(self) -> dict[str, int]:
        """Host -> when the server last received a batch from its agent (proof of life)."""
        collector = self.app.state.collector
        return dict(collector.host_seen_ns) if collector is not None else {}

    def _job_seen(self, job: str) -> int:
        """When the server last received a batch holding ``job``'s rows (0: unknown)."""
        collector = self.app.state.collector
        return int(collector.job_seen_ns.get(job, 0)) if collector is not None else 0

    def _schedule(self, job: str, due_in_s: float | None, now_ns: int) -> None:
        if due_in_s is None:
            self._due_ns.pop(job, None)
        else:
            self._due_ns[job] = now_ns + int(max(due_in_s, MIN_RECHECK_S) * 1e9)

    def _wake_dispatcher(self, queued: int) -> None:
        """Deliver new alert rows now, not after the rest of this pass."""
        dispatcher = self.app.state.alert_dispatcher
        if queued and dispatcher is not None:
            dispatcher.wake()
