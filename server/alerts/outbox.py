"""The persisted alert outbox: enqueue (deduplicated), claims, backoff, delivery marks.

Every notification is a row in ``alert_outbox`` before anything is sent, so a restart
loses nothing; ``dedup_key`` (webhook, incident, rule, status) makes enqueueing
idempotent, so the same firing or resolved notification is queued once.

Several server replicas share one outbox. A dispatcher pass first **claims** due rows
(:func:`claim_due`): one ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)
AND lease_until_ns <= now RETURNING id`` writes its claim token and a lease. On
PostgreSQL the row locks let concurrent replicas skip each other's rows; on SQLite
(where ``FOR UPDATE`` is not rendered) the single UPDATE runs under the database write
lock and its condition is evaluated there, so a row is claimed by one pass only. The
pass then posts and marks only rows that still carry its token. A replica killed in
flight leaves its claims to expire; the next claim after the lease delivers them again,
so delivery is at least once, and each alert carries a stable ``notification_id``
(:func:`notification_id`) a receiver deduplicates by.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Sequence

from fleetscope.server.db.diagnosis_models import AlertOutbox, AlertRule, Incident, Webhook, dumps
from sqlalchemy import Select, Update, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .payload import group_key_of, incident_alert
from .rules import install_defaults, rule_matches, webhook_accepts


class OutboxSink:
    """The diagnosis services' incident sink (:class:`fleetscope.server.diagnosis.incidents.
    IncidentSink`): installs the default rules and queues each changed incident's alerts,
    with links to ``base_url`` (the server's public URL, may be empty)."""

    def __init__(self, base_url: str = "") -> None:
        self.base_url = base_url

    def install(self, session: Session) -> None:
        install_defaults(session)

    def notify(self, session: Session, incident: Incident, now_ns: int) -> int:
        return enqueue_incident(session, incident, now_ns, self.base_url)


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


def claimable_ids(now_ns: int, limit: int) -> Select:
    """Due, unclaimed (or lease-expired) pending row ids, oldest first; locked, skipping locked rows."""
    return (
        select(AlertOutbox.id)
        .where(AlertOutbox.status == "pending", AlertOutbox.next_attempt_ns <= now_ns,
               AlertOutbox.lease_until_ns <= now_ns)
        .order_by(AlertOutbox.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )


def claim_statement(now_ns: int, token: str, lease_ns: int, limit: int = 200) -> Update:
    """The one statement that claims due rows for ``token`` until ``now_ns + lease_ns``."""
    return (
        update(AlertOutbox)
        .where(AlertOutbox.id.in_(claimable_ids(now_ns, limit).scalar_subquery()),
               AlertOutbox.status == "pending", AlertOutbox.lease_until_ns <= now_ns)
        .values(claim=token, lease_until_ns=now_ns + lease_ns)
        .returning(AlertOutbox.id)
        .execution_options(synchronize_session=False)
    )


def claim_due(session: Session, now_ns: int, token: str, lease_ns: int, limit: int = 200
              ) -> dict[tuple[int, str], list[AlertOutbox]]:
    """Claim due rows for this pass (committed) and return them grouped by (webhook id, group key).

    ``token`` must be unique per pass and replica; rows another pass holds are skipped.
    """
    ids = [r[0] for r in session.execute(claim_statement(now_ns, token, lease_ns, limit))]
    session.commit()
    if not ids:
        return {}
    rows = session.scalars(select(AlertOutbox).where(AlertOutbox.id.in_(ids), AlertOutbox.claim == token)
                           .order_by(AlertOutbox.id).execution_options(populate_existing=True))
    groups: dict[tuple[int, str], list[AlertOutbox]] = {}
    for r in rows:
        groups.setdefault((r.webhook_id, r.group_key), []).append(r)
    return groups


def held_rows(session: Session, ids: Sequence[int], token: str) -> list[AlertOutbox]:
    """The rows of ``ids`` still claimed by ``token`` (a lease that ran out may be another's now)."""
    return list(session.scalars(select(AlertOutbox).where(AlertOutbox.id.in_(list(ids)), AlertOutbox.claim == token)
                                .execution_options(populate_existing=True)))


def notification_id(row: AlertOutbox) -> str:
    """Stable id of one notification (webhook, incident, rule, firing|resolved), the same on
    every delivery attempt and every replica: what a receiver deduplicates by."""
    return "fsn-" + hashlib.sha256(row.dedup_key.encode()).hexdigest()[:24]


def backoff_ns(attempts: int, base_s: float, max_s: float) -> int:
    """Exponential backoff with full jitter in [0.5, 1] x min(max, base x 2^(attempts-1))."""
    delay = min(max_s, base_s * (2 ** max(attempts - 1, 0)))
    return int(delay * random.uniform(0.5, 1.0) * 1e9)


def mark_delivered(session: Session, rows: Iterable[AlertOutbox], now_ns: int) -> None:
    for r in rows:
        r.status, r.delivered_ns, r.attempts = "delivered", now_ns, r.attempts + 1
        r.claim, r.lease_until_ns = "", 0
    session.commit()


def mark_failed(session: Session, rows: Iterable[AlertOutbox], error: str, now_ns: int,
                max_attempts: int, base_s: float, max_s: float, permanent: bool = False) -> None:
    """Count a failed attempt; schedule a retry, or give up after ``max_attempts`` (at once
    when ``permanent``: a URL refused or malformed fails the same way every time)."""
    for r in rows:
        r.attempts += 1
        r.last_error = error[:2000]
        r.claim, r.lease_until_ns = "", 0
        if permanent or r.attempts >= max_attempts:
            r.status = "failed"
        else:
            r.next_attempt_ns = now_ns + backoff_ns(r.attempts, base_s, max_s)
    session.commit()


def public_error(error: str) -> str:
    """What an API answer shows of a delivery error: a receiver's answer only by its status
    (rows written by older versions kept up to 200 characters of the answer body)."""
    if error.startswith("HTTP "):
        return error.split(":", 1)[0][:12]
    return error


def alerts_of(rows: Iterable[AlertOutbox]) -> list[dict]:
    return [json.loads(r.alert) for r in rows]
