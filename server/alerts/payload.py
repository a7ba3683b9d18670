"""Prometheus Alertmanager webhook payloads (``version: "4"``) built from incidents.

Existing Alertmanager receivers parse these unchanged; fleetscope's details (culprit
ranks, hosts, group, estimated slowdown, evidence, a dashboard link) travel in the
annotations, as strings like every Alertmanager annotation.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any

ZERO_TIME = "0001-01-01T00:00:00Z"


def rfc3339(ns: int | None) -> str:
    """RFC 3339 UTC timestamp of epoch nanoseconds (Alertmanager's zero time for None)."""
    if not ns:
        return ZERO_TIME
    t = dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def fingerprint(labels: dict[str, str]) -> str:
    """Stable 16-hex-digit id of a label set (Alertmanager uses a label-set hash too)."""
    text = "\xff".join(f"{k}\xfe{v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def alert_name(kind: str) -> str:
    return "Fleetscope" + "".join(p.capitalize() for p in kind.split("_"))


def incident_alert(incident: Any, rule: Any, status: str, base_url: str = "") -> dict[str, Any]:
    """One Alertmanager alert object for an incident matched by a rule."""
    ranks = json.loads(incident.ranks or "[]")
    hosts = json.loads(incident.hosts or "[]")
    evidence = json.loads(incident.evidence or "{}")
    labels = {
        "alertname": alert_name(rule.kind),
        "job": incident.job,
        "severity": rule.severity or incident.severity,
        "kind": incident.kind,
        "rule": rule.name,
        "incident": str(incident.id),
        "service": "fleetscope",
    }
    link = f"{base_url.rstrip('/')}/ui/jobs/{incident.job}?incident={incident.id}" if base_url else ""
    annotations = {
        "summary": incident.summary,
        "description": f"{incident.kind} in job {incident.job}: culprit rank(s) {ranks[:8]} on {hosts[:8]}",
        "culprit_ranks": json.dumps(ranks),
        "hosts": json.dumps(hosts),
        "group_id": incident.group_id,
        "est_slowdown": f"{incident.est_slowdown:.4f}",
        "first_step": str(incident.first_step),
        "last_step": str(incident.last_step),
        "evidence": json.dumps(evidence, default=str)[:8000],
        "dashboard": link,
        "incident_api": f"{base_url.rstrip('/')}/api/v1/incidents/{incident.id}" if base_url else "",
    }
    ends = incident.resolved_ns if status == "resolved" else None
    return {
        "status": status,
        "labels": labels,
        "annotations": annotations,
        "startsAt": rfc3339(incident.opened_ns),
        "endsAt": rfc3339(ends),
        "generatorURL": link,
        "fingerprint": fingerprint(labels),
    }


GROUP_BY = ("alertname", "job")


def group_key_of(alert: dict[str, Any]) -> str:
    """Alertmanager-style group key over :data:`GROUP_BY` labels."""
    labels = alert["labels"]
    inner = ", ".join(f'{k}="{labels.get(k, "")}"' for k in GROUP_BY)
    return "{}:{" + inner + "}"


def build_payload(receiver: str, alerts: list[dict[str, Any]], external_url: str = "") -> dict[str, Any]:
    """The webhook body for one group of alerts (same group key)."""
    if not alerts:
        raise ValueError("build_payload: no alerts")
    common_labels = _common([a["labels"] for a in alerts])
    common_ann = _common([a["annotations"] for a in alerts])
    return {
        "version": "4",
        "groupKey": group_key_of(alerts[0]),
        "truncatedAlerts": 0,
        "status": "firing" if any(a["status"] == "firing" for a in alerts) else "resolved",
        "receiver": receiver,
        "groupLabels": {k: alerts[0]["labels"].get(k, "") for k in GROUP_BY},
        "commonLabels": common_labels,
        "commonAnnotations": common_ann,
        "externalURL": external_url,
        "alerts": alerts,
    }


def _common(dicts: list[dict[str, str]]) -> dict[str, str]:
    first = dicts[0]
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in dicts[1:])}
