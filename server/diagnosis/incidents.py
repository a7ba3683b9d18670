"""Incidents: open, update and resolve them from each diagnosis pass's findings.

A finding's ``key`` (kind + culprit, or just ``hang`` - one hang per job at a time)
identifies the problem across passes. An open incident absent from the findings for
``resolve_after_s`` is resolved; when the job finished, its open incidents are resolved.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

from fleetscope.server.db.diagnosis_models import Incident, dumps
from sqlalchemy import select
from sqlalchemy.orm import Session

from .findings import Finding, finding_to_dict

OPEN_STATES = ("open", "acknowledged")


@dataclass
class Change:
    incident: Incident
    what: str
    """opened | updated | resolved"""


class IncidentSink(Protocol):
    """Where changed incidents go: the composition root passes one in (the alert outbox,
    :class:`fleetscope.server.alerts.outbox.OutboxSink`), so diagnosis only opens,
    updates and resolves incidents and never imports the alerting layer."""

    def install(self, session: Session) -> None:
        """Once at start: whatever the sink needs in the DB (the default alert rules)."""

    def notify(self, session: Session, incident: Incident, now_ns: int) -> int:
        """A changed incident, in the caller's transaction; returns rows queued (0: none)."""


def incident_key(f: Finding) -> str:
    if f.kind.value in ("hang", "mfu_drop"):
        return f.kind.value
    if f.kind.value in ("heartbeat_lost", "hardware_error") and f.hosts:
        return f"{f.kind.value}:{','.join(f.hosts)}"
    return f.key


def sync_incidents(session: Session, job: str, findings: list[Finding], now_ns: int,
                   resolve_after_s: float, job_finished: bool = False,
                   resolve_missing: bool = True, commit: bool = True) -> list[Change]:
    """Apply one pass's findings to the job's incidents; returns what changed.

    ``resolve_missing=False`` for a partial pass (only some detectors ran): incidents
    absent from ``findings`` are left alone. ``commit=False`` leaves the changes in the
    session's transaction, for a caller that makes more in the same one (a finished job's
    final findings must never be seen open: they are stored already resolved).
    """
    open_rows = {i.key: i for i in session.scalars(
        select(Incident).where(Incident.job == job, Incident.status.in_(OPEN_STATES)))}
    changes: list[Change] = []
    seen: set[str] = set()
    for f in findings:
        key = incident_key(f)
        if key in seen:
            continue
        seen.add(key)
        d = finding_to_dict(f)
        inc = open_rows.get(key)
        if inc is None:
            inc = Incident(job=job, key=key, kind=f.kind.value, status="open", opened_ns=now_ns,
                           first_step=f.first_step, num_updates=0)
            session.add(inc)
            what = "opened"
        else:
            what = "updated"
        if what == "updated" and f.kind.value == "hang" and f.evidence.get("all_dead"):
            old_ev = json.loads(inc.evidence or "{}")
            if not old_ev.get("all_dead") and json.loads(inc.ranks or "[]"):
                # the processes went away after a live diagnosis (killed by an operator or
                # the launcher): keep the culprits found while they were alive
                old_ev["all_dead_later"] = True
                inc.evidence = dumps(old_ev)
                inc.last_seen_ns = now_ns
                continue
        material = what == "opened" or _material(inc, f)
        summary = f.summary
        if what == "updated" and f.kind.value == "hang":
            summary = _culprit_revision(inc, f, d)
        inc.severity = f.severity.value
        inc.summary = summary
        inc.ranks = dumps(d["ranks"])
        inc.hosts = dumps(d["hosts"])
        inc.group_id = f.group_id
        inc.score = float(f.score)
        inc.est_slowdown = float(f.est_slowdown)
        inc.last_step = f.last_step
        if inc.first_step < 0 or (f.first_step >= 0 and f.first_step < inc.first_step):
            inc.first_step = f.first_step
        inc.evidence = dumps(d["evidence"])
        inc.last_seen_ns = now_ns
        if material:
            inc.updated_ns = now_ns
            inc.num_updates += 1
            changes.append(Change(inc, what))
    for key, inc in open_rows.items():
        if key in seen or not (resolve_missing or job_finished):
            continue
        gone_s = (now_ns - inc.last_seen_ns) / 1e9
        if job_finished or gone_s >= resolve_after_s:
            inc.status = "resolved"
            inc.resolved_ns = now_ns
            inc.updated_ns = now_ns
            inc.resolution = "job finished" if job_finished else f"not detected for {gone_s:.0f}s"
            changes.append(Change(inc, "resolved"))
    if commit:
        session.commit()
    return changes


def _culprit_revision(inc: Incident, f: Finding, d: dict) -> str:
    """A hang incident whose culprits change: count the revision in the evidence
    (``culprit_revision``: the alert outbox pages each revision once) and say so in the
    summary. Returns the summary to store."""
    old_ev = json.loads(inc.evidence or "{}")
    rev = int(old_ev.get("culprit_revision", 0))
    old_ranks = json.loads(inc.ranks or "[]")
    ev = d["evidence"]
    if sorted(old_ranks) != sorted(f.ranks) and (old_ranks or f.ranks):
        # also a first culprit after a page that named none (the stall was certain before
        # the records that localise it had arrived): the operator must hear who it is
        rev += 1
        why = (ev.get("culprit_changed") or {}).get("why", "new evidence") if old_ranks else \
            "localised once the ranks' records arrived"
        ev["culprit_corrections"] = old_ev.get("culprit_corrections", []) + [
            {"from": old_ranks, "to": list(f.ranks), "why": why}]
    elif old_ev.get("culprit_corrections"):
        ev["culprit_corrections"] = old_ev["culprit_corrections"]
    if rev:
        ev["culprit_revision"] = rev
        last = ev["culprit_corrections"][-1]
        if not last["from"]:
            return f"culprit found: {last['to']} ({last['why']}); {f.summary}"
        return f"culprit corrected from {last['from']} to {last['to']} ({last['why']}); {f.summary}"
    return f.summary


def _material(inc: Incident, f: Finding) -> bool:
    """Did the problem change in a way worth an update (culprits, size, severity)?"""
    return (
        json.loads(inc.ranks) != list(f.ranks)
        or inc.severity != f.severity.value
        or abs(inc.est_slowdown - f.est_slowdown) >= 0.02
        or inc.last_step != f.last_step
    )
