"""What ``GET /metrics`` exports, in the Prometheus text format.

Built on ``prometheus_client``'s custom-collector API: every scrape yields metric
families computed from the control-plane DB, the store and the server's own counters,
at most once per ``metrics_cache_s`` (concurrent scrapes share one computation). The
OpenTelemetry Prometheus exporter was the other candidate; it would only wrap the same
``prometheus_client`` registry behind a MeterProvider and observable-instrument
callbacks, with no gain for values that are read at scrape time.

Where the values come from, so they survive diagnosis moving into its own process:

* jobs, status, world size: the ``jobs`` table of the SQL DB;
* incidents (by kind, severity, status), hang state and the straggler suspects: the
  persisted ``incidents`` table, not the in-process diagnosis result;
* step time, steps/s, tokens/s, MFU, seconds since the last step: ``step_rollup``,
  read incrementally (each refresh reads only the steps after the last one counted, a
  key-range read of one row per rank per new step, see
  :mod:`fleetscope.server.store.metrics_queries`); the step-time histogram is a true
  cumulative histogram of every step this process has counted (plus a backfill of
  :data:`BACKFILL_STEPS` when it first sees a job), so ``rate()`` and
  ``histogram_quantile()`` work on it;
* ingest, alert delivery and diagnosis-pass counters: the processes' own counters
  (a counter restarts at 0 with its process, as Prometheus expects).

Jobs are labelled ``job_id``: Prometheus sets ``job`` (the scrape job) on every series,
so a ``job`` label here would be renamed ``exported_job`` at scrape time.

Cardinality is fixed by construction: per job a constant number of series (the
straggler families carry at most ``metrics_top_k`` series, labelled by ``position``
1..k, with the culprit rank as the *value* of ``fleetscope_straggler_rank``), at most
``metrics_max_jobs`` jobs, and incident series bounded by kinds x severities x 2
statuses. Nothing is labelled by rank or host, so 12,288 ranks export what 8 do.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fleetscope.server.db.diagnosis_models import AlertOutbox, Incident
from fleetscope.server.db.instrumentation_models import Instrumentation
from fleetscope.server.db.models import Job
from fleetscope.server.diagnosis.findings import STRAGGLER_KINDS
from fleetscope.server.state import server_state
from fleetscope.server.store import metrics_queries as mq
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from sqlalchemy import func, or_, select

from fleetscope import __version__
from fleetscope.control import LEVELS

log = logging.getLogger(__name__)

STEP_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
"""Upper bounds (s) of the step-time histogram buckets (+Inf is added)."""
BACKFILL_STEPS = 200
"""Steps before the newest one counted when a process first sees a job."""
MAX_NEW_STEPS = 5000
"""Most new steps one refresh reads per job (the rest follow at the next refresh)."""
RATE_WINDOW_STEPS = 20
"""Steps/s is measured over this many latest counted steps."""
JOB_STATUSES = ("running", "finished", "failed", "lost")
ACTIVE = ("open", "acknowledged")
STRAGGLER_VALUES = tuple(sorted(k.value for k in STRAGGLER_KINDS))


@dataclass
class JobSteps:
    """One job's step-time histogram and rate, advanced by each refresh."""

    attempt: int
    after: int
    """Last step counted (or the backfill start)."""
    buckets: list[int] = field(default_factory=lambda: [0] * (len(STEP_BUCKETS_S) + 1))
    count: int = 0
    sum_s: float = 0.0
    recent: deque = field(default_factory=lambda: deque(maxlen=RATE_WINDOW_STEPS))
    """(step, end_ns) of the latest counted steps."""
    last_step: int | None = None
    last_end_ns: int | None = None
    num_ranks: int = 0
    tokens_step: int | None = None
    tokens_per_step: float = 0.0

    def add(self, step: int, step_s: float, end_ns: int) -> None:
        self.buckets[bisect.bisect_left(STEP_BUCKETS_S, step_s)] += 1
        self.count += 1
        self.sum_s += step_s
        self.after = step
        self.recent.append((step, end_ns))

    def steps_per_s(self) -> float | None:
        if len(self.recent) < 2:
            return None
        (s0, e0), (s1, e1) = self.recent[0], self.recent[-1]
        return (s1 - s0) / ((e1 - e0) / 1e9) if e1 > e0 and s1 > s0 else None

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, n in zip((*STEP_BUCKETS_S, float("inf")), self.buckets):
            acc += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), acc))
        return out


class FleetMetrics:
    """The metric families of one server process, cached for ``cache_s``.

    Args:
        app: the FastAPI app (its ``state`` holds settings, store, db, collector,
            services, alert dispatcher).
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        s = app.state.settings
        self.cache_s = float(s.metrics_cache_s)
        self.top_k = int(s.metrics_top_k)
        self.job_window_s = float(s.metrics_job_window_s)
        self.max_jobs = int(s.metrics_max_jobs)
        self._lock = threading.Lock()
        self._cached: list[Metric] = []
        self._cached_at = float("-inf")
        self._jobs: dict[str, JobSteps] = {}
        self.last_collect_s = 0.0

    # ---- prometheus_client collector protocol ----------------------------------------
    def collect(self) -> list[Metric]:
        """The families of the latest snapshot (recomputed when older than ``cache_s``)."""
        with self._lock:
            if time.monotonic() - self._cached_at >= self.cache_s:
                t0 = time.perf_counter()
                self._cached = self._compute()
                self.last_collect_s = time.perf_counter() - t0
                self._cached_at = time.monotonic()
                self._cached.append(self._collect_time())
            return list(self._cached)

    def _collect_time(self) -> Metric:
        g = GaugeMetricFamily("fleetscope_metrics_collect_seconds",
                              "Seconds the latest /metrics snapshot took to compute.")
        g.add_metric([], self.last_collect_s)
        return g

    # ---- the snapshot ----------------------------------------------------------------
    def _compute(self) -> list[Metric]:
        now_ns = time.time_ns()
        info = GaugeMetricFamily("fleetscope_build_info", "The fleetscope version of this server.",
                                 labels=["version"])
        info.add_metric([__version__], 1)
        out: list[Metric] = [info]
        jobs, incidents, outbox = self._read_db(now_ns)
        out += self._job_families(jobs, incidents, now_ns)
        out += self._incident_families(incidents)
        out += self._server_families(outbox)
        return out

    def _read_db(self, now_ns: int) -> tuple[list[dict], list[dict], dict[str, int]]:
        db = self.app.state.db
        if db is None:
            return [], [], {}
        since = now_ns - int(self.job_window_s * 1e9)
        with db() as s:
            q = (select(Job).where(or_(Job.status == "running", Job.updated_ns >= since))
                 .order_by((Job.status != "running"), Job.updated_ns.desc(), Job.id).limit(self.max_jobs))
            jobs = [{"id": j.id, "name": j.name, "attempt": j.attempt, "status": j.status, "dp": j.dp,
                     "world_size": j.world_size, "device_name": j.device_name,
                     "model_flops_per_step": j.model_flops_per_step or 0.0,
                     "device_peak_flops": j.device_peak_flops or 0.0} for j in s.scalars(q)]
            levels = {r.job: (r.level, r.ranks) for r in s.scalars(
                select(Instrumentation).where(Instrumentation.job.in_([j["id"] for j in jobs])))} if jobs else {}
            for j in jobs:
                j["instrumentation"] = levels.get(j["id"], ("full", "{}"))
            rows = s.execute(select(Incident.job, Incident.kind, Incident.severity, Incident.status,
                                    Incident.ranks, Incident.score, Incident.est_slowdown)
                             .where(Incident.status.in_(ACTIVE))).all()
            incidents = [{"job": r[0], "kind": r[1], "severity": r[2], "status": r[3], "ranks": r[4],
                          "score": r[5], "est_slowdown": r[6]} for r in rows]
            outbox = dict(s.execute(select(AlertOutbox.status, func.count())
                                    .where(AlertOutbox.status.in_(("pending", "failed")))
                                    .group_by(AlertOutbox.status)).all())
        return jobs, incidents, outbox

    def _job_families(self, jobs: list[dict], incidents: list[dict], now_ns: int) -> list[Metric]:
        labels = ["job_id"]
        job_info = GaugeMetricFamily("fleetscope_job_info", "A job known to the server (value 1).",
                                     labels=["job_id", "name", "device"])
        status = GaugeMetricFamily("fleetscope_job_status",
                                   "1 for the job's current status, 0 for the others.", labels=["job_id", "status"])
        world = GaugeMetricFamily("fleetscope_job_world_size", "Ranks of the job (dp x tp x pp).", labels=labels)
        hist = HistogramMetricFamily("fleetscope_job_step_duration_seconds",
                                     "Step time of the job (its slowest rank) for every step counted.",
                                     labels=labels)
        rate = GaugeMetricFamily("fleetscope_job_steps_per_second",
                                 f"Steps per second over the latest {RATE_WINDOW_STEPS} steps.", labels=labels)
        tokens = GaugeMetricFamily("fleetscope_job_tokens_per_second",
                                   "Tokens per second of the whole job (0 when the trainer reports none).",
                                   labels=labels)
        mfu = GaugeMetricFamily("fleetscope_job_mfu_ratio",
                                "Model FLOPs utilisation (0-1); absent without model and device FLOPs.",
                                labels=labels)
        last = GaugeMetricFamily("fleetscope_job_last_step", "Newest step reported by any rank.", labels=labels)
        since = GaugeMetricFamily("fleetscope_job_seconds_since_last_step",
                                  "Seconds since the newest step ended.", labels=labels)
        ranks = GaugeMetricFamily("fleetscope_job_ranks_reporting",
                                  "Ranks that reported the newest step.", labels=labels)
        hung = GaugeMetricFamily("fleetscope_job_hung", "1 while the job has an active hang incident.",
                                 labels=labels)
        culprit = GaugeMetricFamily("fleetscope_job_hang_culprit_rank",
                                    "First culprit rank of the job's active hang incident (absent when not hung).",
                                    labels=labels)
        suspects = GaugeMetricFamily("fleetscope_job_straggler_suspects",
                                     "Active straggler incidents of the job (all of them, not only the top k).",
                                     labels=labels)
        level = GaugeMetricFamily("fleetscope_job_instrumentation_level",
                                  "1 for the job-wide instrumentation level its hooks run at (runtime control: "
                                  "off, steps, sections, full), 0 for the others.", labels=["job_id", "level"])
        level_ranks = GaugeMetricFamily("fleetscope_job_instrumentation_ranks",
                                        "Ranks of the job running at each instrumentation level (the job-wide "
                                        "level with the per-rank overrides applied).", labels=["job_id", "level"])
        pos = ["job_id", "position"]
        s_rank = GaugeMetricFamily("fleetscope_straggler_rank",
                                   "Culprit rank of the job's k-th straggler suspect (by est. slowdown).",
                                   labels=pos)
        s_score = GaugeMetricFamily("fleetscope_straggler_score", "Score of the k-th straggler suspect.",
                                    labels=pos)
        s_slow = GaugeMetricFamily("fleetscope_straggler_est_slowdown_ratio",
                                   "Estimated job slowdown caused by the k-th suspect (0.1 = 10%).", labels=pos)
        by_job: dict[str, list[dict]] = {}
        for inc in incidents:
            by_job.setdefault(inc["job"], []).append(inc)
        store = self.app.state.store
        seen = set()
        for j in jobs:
            jid = j["id"]
            seen.add(jid)
            job_info.add_metric([jid, j["name"] or jid, j["device_name"] or ""], 1)
            for st in sorted({*JOB_STATUSES, j["status"]}):
                status.add_metric([jid, st], 1.0 if st == j["status"] else 0.0)
            world.add_metric([jid], j["world_size"])
            self._add_levels(level, level_ranks, jid, j)
            mine = by_job.get(jid, [])
            hangs = [i for i in mine if i["kind"] == "hang"]
            hung.add_metric([jid], 1.0 if hangs else 0.0)
            hang_ranks = json.loads(hangs[0]["ranks"] or "[]") if hangs else []
            if hang_ranks:
                culprit.add_metric([jid], hang_ranks[0])
            strag = sorted((i for i in mine if i["kind"] in STRAGGLER_VALUES),
                           key=lambda i: (-(i["est_slowdown"] or 0), -(i["score"] or 0)))
            suspects.add_metric([jid], len(strag))
            for n, inc in enumerate(strag[: self.top_k], start=1):
                culprits = json.loads(inc["ranks"] or "[]")
                if culprits:
                    s_rank.add_metric([jid, str(n)], culprits[0])
                s_score.add_metric([jid, str(n)], float(inc["score"] or 0))
                s_slow.add_metric([jid, str(n)], float(inc["est_slowdown"] or 0))
            if store is None:
                continue
            try:
                st = self._advance(store, j)
            except Exception:
                log.warning("metrics: reading steps of job %s failed", jid, exc_info=True)
                continue
            hist.add_metric([jid], st.cumulative(), sum_value=st.sum_s)
            sps = st.steps_per_s()
            if sps is not None:
                rate.add_metric([jid], sps)
                tokens.add_metric([jid], st.tokens_per_step * sps)
                if j["model_flops_per_step"] > 0 and j["device_peak_flops"] > 0 and j["world_size"]:
                    mfu.add_metric([jid], j["model_flops_per_step"] * sps / (j["world_size"] * j["device_peak_flops"]))
            if st.last_step is not None:
                last.add_metric([jid], st.last_step)
                ranks.add_metric([jid], st.num_ranks)
            if st.last_end_ns:
                since.add_metric([jid], max(0.0, (now_ns - st.last_end_ns) / 1e9))
        for gone in set(self._jobs) - seen:  # jobs past the window: forget their state
            del self._jobs[gone]
        return [job_info, status, world, level, level_ranks, hist, rate, tokens, mfu, last, since, ranks, hung, culprit, suspects,
                s_rank, s_score, s_slow]

    @staticmethod
    def _add_levels(level: GaugeMetricFamily, level_ranks: GaugeMetricFamily, jid: str, j: dict) -> None:
        """One series per level (4 per job), whatever the ranks set: cardinality stays fixed."""
        current, overrides = j.get("instrumentation", ("full", "{}"))
        try:
            per_rank = {int(k): v for k, v in json.loads(overrides or "{}").items()}
        except (ValueError, AttributeError):
            per_rank = {}
        world = int(j["world_size"] or 0)
        counts = dict.fromkeys(LEVELS, 0)
        overridden = 0
        for r, lv in per_rank.items():
            if 0 <= r < world and lv in counts:
                counts[lv] += 1
                overridden += 1
        if current in counts:
            counts[current] += world - overridden
        for lv in LEVELS:
            level.add_metric([jid, lv], 1.0 if lv == current else 0.0)
            level_ranks.add_metric([jid, lv], counts[lv])

    def _advance(self, store: Any, j: dict) -> JobSteps:
        """Count the job's steps completed since the previous refresh."""
        st = self._jobs.get(j["id"])
        if st is None or st.attempt != j["attempt"]:
            newest = mq.latest_step(store, j["id"], j["attempt"])
            st = JobSteps(attempt=j["attempt"], after=-1 if newest is None else newest - BACKFILL_STEPS)
            self._jobs[j["id"]] = st
        rows = mq.steps_after(store, j["id"], j["attempt"], st.after, MAX_NEW_STEPS)
        if rows:
            newest = rows[-1]
            st.last_step = newest["step"]
            st.num_ranks = newest["num_ranks"]
            st.last_end_ns = max(st.last_end_ns or 0, newest["end_ns"])
        settled = j["status"] != "running"
        for r in rows:
            # a step is counted once every rank reported it, a later step exists, or the job ended
            if r["num_ranks"] < j["world_size"] and r is rows[-1] and not settled:
                break
            st.add(r["step"], r["step_ns"] / 1e9, r["end_ns"])
        if st.recent and st.tokens_step != st.recent[-1][0]:
            st.tokens_step = st.recent[-1][0]
            st.tokens_per_step = mq.step_tokens(store, j["id"], j["attempt"], st.tokens_step, j["dp"])
        return st

    def _incident_families(self, incidents: list[dict]) -> list[Metric]:
        fam = GaugeMetricFamily("fleetscope_incidents_active",
                                "Open and acknowledged incidents by job, kind, severity and status.",
                                labels=["job_id", "kind", "severity", "status"])
        counts: dict[tuple[str, str, str, str], int] = {}
        for i in incidents:
            key = (i["job"], i["kind"], i["severity"], i["status"])
            counts[key] = counts.get(key, 0) + 1
        for key, n in sorted(counts.items()):
            fam.add_metric(list(key), n)
        return [fam]

    def _server_families(self, outbox: dict[str, int]) -> list[Metric]:
        st = self.app.state
        w = st.collector
        stats = dict(w.stats) if w is not None else {}
        records = CounterMetricFamily("fleetscope_ingest_records",
                                      "Records written to the store by this process, by record type.",
                                      labels=["type"])
        for name, n in sorted((dict(w.rows_by_table) if w is not None else {}).items()):
            records.add_metric([name], n)
        batches = CounterMetricFamily("fleetscope_ingest_batches", "Ingest batches stored (duplicates included).")
        batches.add_metric([], stats.get("batches", 0))
        dups = CounterMetricFamily("fleetscope_ingest_duplicate_batches",
                                   "Ingest batches answered as duplicates of stored ones.")
        dups.add_metric([], stats.get("duplicates", 0))
        rejected = CounterMetricFamily("fleetscope_ingest_rejected_batches",
                                       "Ingest batches refused (HTTP 429: the writer queue was full).",
                                       labels=["reason"])
        rejected.add_metric(["queue_full"], stats.get("rejected_429", 0))
        queued = GaugeMetricFamily("fleetscope_ingest_queued_rows", "Rows accepted but not yet stored.")
        queued.add_metric([], w.queued_rows if w is not None else 0)
        lag = GaugeMetricFamily("fleetscope_ingest_lag_seconds",
                                "Accepted-to-stored seconds of the oldest batch of the latest write.")
        lag.add_metric([], float(w.last_lag_s) if w is not None else 0.0)
        oldest = GaugeMetricFamily("fleetscope_ingest_oldest_queued_seconds",
                                   "Seconds the oldest batch not yet stored has waited.")
        oldest.add_metric([], float(w.oldest_queued_s) if w is not None else 0.0)
        passes = SummaryMetricFamily("fleetscope_diagnosis_pass_seconds",
                                     "Diagnosis and self-check passes of this process and their duration.",
                                     labels=["service", "pass"])
        last_pass = GaugeMetricFamily("fleetscope_diagnosis_last_pass_seconds",
                                      "Duration of the latest pass.", labels=["service", "pass"])
        for svc in st.services:
            for name, (n, total, latest) in sorted(dict(getattr(svc, "pass_seconds", None) or {}).items()):
                svc_name = str(getattr(svc, "name", type(svc).__name__))
                passes.add_metric([svc_name, name], count_value=n, sum_value=total)
                last_pass.add_metric([svc_name, name], latest)
        # diagnosis worker processes report theirs (server/api/routes/internal.py): summed over
        # the workers under service "diagnosis-worker" (the last pass: the slowest of the workers'
        # latest), so the series stay fixed however many workers run
        merged: dict[str, list[float]] = {}
        for report in list(st.worker_passes.values()):
            for name, (n, total, latest) in report.items():
                acc = merged.setdefault(name, [0, 0.0, 0.0])
                acc[0] += n
                acc[1] += total
                acc[2] = max(acc[2], latest)
        for name, (n, total, latest) in sorted(merged.items()):
            passes.add_metric(["diagnosis-worker", name], count_value=int(n), sum_value=total)
            last_pass.add_metric(["diagnosis-worker", name], latest)
        box = GaugeMetricFamily("fleetscope_alert_outbox_rows",
                                "Alert notifications not delivered: pending (queued or retrying) or failed "
                                "(gave up).", labels=["status"])
        for status in ("pending", "failed"):
            box.add_metric([status], outbox.get(status, 0))
        d = st.alert_dispatcher
        delivered = CounterMetricFamily("fleetscope_alert_deliveries", "Webhook payloads delivered (2xx).")
        delivered.add_metric([], d.num_delivered if d is not None else 0)
        failures = CounterMetricFamily("fleetscope_alert_delivery_failures",
                                       "Webhook delivery attempts that failed (error or non-2xx answer).")
        failures.add_metric([], d.num_failed_attempts if d is not None else 0)
        return [records, batches, dups, rejected, queued, lag, oldest, passes, last_pass, box, delivered, failures]


def fleet_metrics(app: Any) -> FleetMetrics:
    """The app's :class:`FleetMetrics` (made on first use)."""
    return server_state(app).fleet_metrics
