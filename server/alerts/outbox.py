"""The persisted alert outbox: enqueue (deduplicated), due rows, backoff, delivery marks.

Every notification is a row in ``alert_outbox`` before anything is sent, so a restart
loses nothing; ``dedup_key`` (webhook, incident, rule, status) makes enqueueing
idempotent, so the same firing or resolved notification is sent at most once.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable

from fleetscope.server.db.diagnosis_models import AlertOutbox, AlertRule, Incident, Webhook, dumps
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .payload import group_key_of, incident_alert
from .rules import rule_matches, webhook_accepts


def enqueue_incident(session: Session, inc: Incident, now_ns: int, base_url: str = "") -> int:
    """Queue firing (open incident) or resolved notifications for every matching rule/webhook.

    A resolved notification is only queued where a firing one was queued before.
    Returns the number of rows added.
    """
    resolved = inc.status == "resolved"
    # a hang incident whose culprit was corrected pages the correction once per revision
    revision = int(json.loads(inc.evidence or "{}").get("culprit_revision", 0) or 0)
    rules = list(session.scalars(select(AlertRule).where(AlertRule.enabled.is_(True))))
    hooks = list(session.scalars(select(Webhook).where(Webhook.enabled.is_(True))))
    added = 0
    for rule in rules:
        if not resolved and not rule_matches(rule, inc):
            continue
        for hook in hooks:
            if not webhook_accepts(hook, inc, rule):
                continue
            base = f"{hook.id}:{inc.id}:{rule.id}"
            if resolved and not _exists(session, base + ":firing"):
                continue
            status = "resolved" if resolved else "firing"
            key = f"{base}:{status}" if resolved or not revision else f"{base}:firing:r{revision}"
            if _exists(session, key):
                continue
            alert = incident_alert(inc, rule, status, base_url)
            row = AlertOutbox(webhook_id=hook.id, incident_id=inc.id, rule_id=rule.id,
                              dedup_key=key, group_key=group_key_of(alert),
                              alert_status=status, alert=dumps(alert), status="pending",
                              next_attempt_ns=now_ns, created_ns=now_ns)
            try:
                with session.begin_nested():
                    session.add(row)
                added += 1
            except IntegrityError:  # queued concurrently by another replica
                pass
    session.commit()
    return added


def _exists(session: Session, key: str) -> bool:
    return session.scalar(select(AlertOutbox.id).where(AlertOutbox.dedup_key == key)) is not None


def due_groups(session: Session, now_ns: int, limit: int = 200) -> dict[tuple[int, str], list[AlertOutbox]]:
    """Pending rows whose time has come, grouped by (webhook id, group key)."""
    rows = session.scalars(
        select(AlertOutbox)
        .where(AlertOutbox.status == "pending", AlertOutbox.next_attempt_ns <= now_ns)
        .order_by(AlertOutbox.id)
        .limit(limit)
    )
    groups: dict[tuple[int, str], list[AlertOutbox]] = {}
    for r in rows:
        groups.setdefault((r.webhook_id, r.group_key), []).append(r)
    return groups


def backoff_ns(attempts: int, base_s: float, max_s: float) -> int:
    """Exponential backoff with full jitter in [0.5, 1] x min(max, base x 2^(attempts-1))."""
    delay = min(max_s, base_s * (2 ** max(attempts - 1, 0)))
    return int(delay * random.uniform(0.5, 1.0) * 1e9)


def mark_delivered(session: Session, rows: Iterable[AlertOutbox], now_ns: int) -> None:
    for r in rows:
        r.status, r.delivered_ns, r.attempts = "delivered", now_ns, r.attempts + 1
    session.commit()


def mark_failed(session: Session, rows: Iterable[AlertOutbox], error: str, now_ns: int,
                max_attempts: int, base_s: float, max_s: float) -> None:
    """Count a failed attempt; schedule a retry or give up after ``max_attempts``."""
    for r in rows:
        r.attempts += 1
        r.last_error = error[:2000]
        if r.attempts >= max_attempts:
            r.status = "failed"
        else:
            r.next_attempt_ns = now_ns + backoff_ns(r.attempts, base_s, max_s)
    session.commit()


def alerts_of(rows: Iterable[AlertOutbox]) -> list[dict]:
    return [json.loads(r.alert) for r in rows]
