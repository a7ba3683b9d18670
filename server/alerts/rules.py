"""Alert rules: which incidents alert, the defaults installed at start, webhook filters."""

from __future__ import annotations

import json
import time
from typing import Any

from fleetscope.server.db.diagnosis_models import AlertRule, Incident, Webhook
from fleetscope.server.diagnosis.findings import STRAGGLER_KINDS
from sqlalchemy import select
from sqlalchemy.orm import Session

RULE_KINDS = ("straggler", "hang", "heartbeat_lost", "hardware_error", "mfu_drop", "collective_mismatch")
SEVERITIES = ("info", "warning", "critical")
STRAGGLER_VALUES = frozenset(k.value for k in STRAGGLER_KINDS)

DEFAULT_RULES: tuple[dict[str, Any], ...] = (
    {"name": "straggler-5pct", "kind": "straggler", "min_slowdown": 0.05, "min_steps": 5,
     "severity": "warning"},
    {"name": "hang", "kind": "hang", "severity": "critical"},
    {"name": "heartbeat-lost", "kind": "heartbeat_lost", "severity": "critical"},
    {"name": "hardware-error", "kind": "hardware_error", "severity": "critical"},
    {"name": "mfu-drop-10pct", "kind": "mfu_drop", "min_mfu_drop": 0.10, "severity": "warning"},
    {"name": "collective-mismatch", "kind": "collective_mismatch", "severity": "critical"},
)


def install_defaults(session: Session) -> int:
    """Insert the built-in rules that are missing (by name); returns how many were added."""
    have = set(session.scalars(select(AlertRule.name)))
    now = time.time_ns()
    added = 0
    for spec in DEFAULT_RULES:
        if spec["name"] not in have:
            session.add(AlertRule(**spec, builtin=True, created_ns=now, updated_ns=now))
            added += 1
    session.commit()
    return added


def rule_kind_of(incident_kind: str) -> str:
    return "straggler" if incident_kind in STRAGGLER_VALUES else incident_kind


def rule_matches(rule: AlertRule, inc: Incident) -> bool:
    """True when the rule is enabled, scoped to the incident's job and its thresholds hold."""
    if not rule.enabled or (rule.job and rule.job != inc.job):
        return False
    if rule.kind != rule_kind_of(inc.kind):
        return False
    if rule.kind == "straggler":
        steps = inc.last_step - inc.first_step + 1 if inc.first_step >= 0 else 0
        return inc.est_slowdown >= rule.min_slowdown and steps >= rule.min_steps
    if rule.kind == "mfu_drop":
        return inc.est_slowdown / (1 + inc.est_slowdown) >= rule.min_mfu_drop
    return True


def webhook_accepts(hook: Webhook, inc: Incident, rule: AlertRule) -> bool:
    """Webhook filters: job list, rule-kind list, minimum severity."""
    if not hook.enabled:
        return False
    jobs = json.loads(hook.filter_jobs or "[]")
    kinds = json.loads(hook.filter_kinds or "[]")
    if jobs and inc.job not in jobs:
        return False
    if kinds and rule.kind not in kinds:
        return False
    sev = rule.severity or inc.severity
    return SEVERITIES.index(sev) >= SEVERITIES.index(hook.min_severity or "info")
