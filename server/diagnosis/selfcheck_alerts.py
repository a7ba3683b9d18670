"""Self-check findings -> incidents -> alerts, through the existing rules and outbox.

A background service (one line in :func:`fleetscope.server.services.service_factories`) scores
the fleet's recent ``probes`` records every ``selfcheck_tick_s`` seconds
(:func:`fleetscope.server.diagnosis.selfcheck.score_probes`) and hands the findings to
the same incident machinery as the job detectors, and the changed incidents to the
sink the composition root gives (the alert outbox):

* each self-check finding becomes a ``hardware_error`` :class:`Finding` naming the host
  (a device that fails its probes, is slower than its fleet peers or computes other
  bits *is* a hardware problem), so the built-in ``hardware-error`` rule and the
  webhooks' filters apply unchanged;
* the incidents belong to the pseudo-job :data:`SELFCHECK_JOB` (probe results are
  per host, not per job; the job or maintenance window of the result is in the
  evidence); one incident per host (key ``hardware_error:<host>``), resolved once the
  host's latest results are clean for ``incident_resolve_s``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, Final

from .findings import Finding, FindingKind, Severity
from .incidents import IncidentSink
from .periodic import PeriodicAlertingService
from .selfcheck import DEFAULT_WINDOW_S, SelfcheckFinding, score_probes
from .selfcheck_report import finding_to_dict

log = logging.getLogger(__name__)

SELFCHECK_JOB: Final = "selfcheck"
"""Job id of the self-check incidents (``GET /api/v1/incidents?job=selfcheck``)."""


def to_findings(findings: Iterable[SelfcheckFinding]) -> list[Finding]:
    """Self-check findings as ``hardware_error`` findings of :data:`SELFCHECK_JOB` (pure)."""
    out = []
    for f in findings:
        evidence = finding_to_dict(f)
        evidence["selfcheck_kind"] = evidence.pop("kind")
        out.append(Finding(
            kind=FindingKind.HARDWARE_ERROR,
            job=SELFCHECK_JOB,
            ranks=(),
            score=float(f.score),
            summary=f"self-check {f.kind.value}: {f.summary}",
            severity=Severity.CRITICAL if f.severity == "critical" else Severity.WARNING,
            hosts=(f.host,),
            evidence=evidence,
        ))
    return out


class SelfcheckAlerts(PeriodicAlertingService):
    """Periodic fleet self-check scoring feeding incidents and the alert outbox."""

    name = "fleetscope-selfcheck-alerts"

    def __init__(self, app: Any, sink: IncidentSink) -> None:
        s = app.state.settings
        super().__init__(app, float(s.selfcheck_tick_s))
        self.resolve_after_s = float(s.incident_resolve_s)
        self.sink = sink
        self.num_ticks = 0

    def tick(self) -> int:
        """One pass: score, sync the incidents, queue alerts; returns alert rows queued."""
        from fleetscope.server.store import probe_queries

        from .incidents import sync_incidents

        now = time.time_ns()
        rows = probe_queries.recent_probes(
            self.app.state.store, since_ns=now - int(DEFAULT_WINDOW_S * 1e9), per_key=6)
        findings = to_findings(score_probes(rows).findings)
        queued = 0
        with self.app.state.db() as session:
            for change in sync_incidents(session, SELFCHECK_JOB, findings, now,
                                         self.resolve_after_s):
                queued += self.sink.notify(session, change.incident, now)
        self.num_ticks += 1
        return queued
