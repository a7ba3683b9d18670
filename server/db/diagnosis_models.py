"""Control-plane models of the diagnosis engine: incidents, alert rules, webhooks, outbox.

JSON-valued columns (ranks, hosts, evidence, filters, payloads) are stored as text so
the same schema works on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base


def dumps(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), sort_keys=True, default=str)


class Incident(Base):
    """One problem of one job over its lifetime: opened, updated each tick, resolved."""

    __tablename__ = "incidents"
    __table_args__ = (Index("ix_incidents_job_key_status", "job", "key", "status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(200), index=True)
    key: Mapped[str] = mapped_column(String(300))
    """Identity of the problem across ticks (kind + culprit ranks or group)."""
    kind: Mapped[str] = mapped_column(String(40), index=True)
    status: Mapped[str] = mapped_column(String(20), default="open", index=True)
    """open | acknowledged | resolved"""
    severity: Mapped[str] = mapped_column(String(20), default="warning")
    summary: Mapped[str] = mapped_column(Text, default="")
    ranks: Mapped[str] = mapped_column(Text, default="[]")
    """JSON list, culprit ranks first."""
    hosts: Mapped[str] = mapped_column(Text, default="[]")
    group_id: Mapped[str] = mapped_column(String(100), default="")
    score: Mapped[float] = mapped_column(Float, default=0.0)
    est_slowdown: Mapped[float] = mapped_column(Float, default=0.0)
    first_step: Mapped[int] = mapped_column(BigInteger, default=-1)
    last_step: Mapped[int] = mapped_column(BigInteger, default=-1)
    evidence: Mapped[str] = mapped_column(Text, default="{}")
    opened_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    last_seen_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    resolved_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    acknowledged_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    acknowledged_by: Mapped[str] = mapped_column(String(200), default="")
    resolution: Mapped[str] = mapped_column(Text, default="")
    num_updates: Mapped[int] = mapped_column(Integer, default=0)

    def to_dict(self) -> dict[str, Any]:
        d = {c.name: getattr(self, c.name) for c in self.__table__.columns}
        for k in ("ranks", "hosts", "evidence"):
            d[k] = json.loads(d[k] or ("{}" if k == "evidence" else "[]"))
        return d


class AlertRule(Base):
    """When an incident becomes an alert."""

    __tablename__ = "alert_rules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    kind: Mapped[str] = mapped_column(String(40))
    """straggler | hang | heartbeat_lost | hardware_error | mfu_drop | collective_mismatch"""
    job: Mapped[str] = mapped_column(String(200), default="")
    """Job id this rule applies to; '' for every job."""
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    min_slowdown: Mapped[float] = mapped_column(Float, default=0.0)
    """straggler: estimated job slowdown at least this fraction (0.05 = 5%)."""
    min_steps: Mapped[int] = mapped_column(Integer, default=0)
    """straggler: seen for at least this many steps."""
    min_mfu_drop: Mapped[float] = mapped_column(Float, default=0.0)
    """mfu_drop: relative decline at least this fraction."""
    severity: Mapped[str] = mapped_column(String(20), default="warning")
    builtin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_ns: Mapped[int] = mapped_column(BigInteger, default=0)

    def to_dict(self) -> dict[str, Any]:
        return {c.name: getattr(self, c.name) for c in self.__table__.columns}


class Webhook(Base):
    """A receiver of Alertmanager-compatible notifications."""

    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(Text, default="")
    """HMAC-SHA256 key for the signature header, sealed (:mod:`fleetscope.server.alerts.secrets`);
    '' sends no signature."""
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    filter_jobs: Mapped[str] = mapped_column(Text, default="[]")
    """JSON list of job ids; empty = all jobs."""
    filter_kinds: Mapped[str] = mapped_column(Text, default="[]")
    """JSON list of rule kinds; empty = all."""
    min_severity: Mapped[str] = mapped_column(String(20), default="info")
    timeout_s: Mapped[float] = mapped_column(Float, default=5.0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=12)
    created_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_ns: Mapped[int] = mapped_column(BigInteger, default=0)

    def to_dict(self, include_secret: bool = False) -> dict[str, Any]:
        d = {c.name: getattr(self, c.name) for c in self.__table__.columns}
        d["filter_jobs"] = json.loads(d["filter_jobs"] or "[]")
        d["filter_kinds"] = json.loads(d["filter_kinds"] or "[]")
        d["has_secret"] = bool(d.pop("secret"))
        if include_secret:
            d["secret"] = self.secret  # the sealed form (see alerts.secrets)
        return d


class AlertOutbox(Base):
    """One alert state change for one webhook, persisted before delivery.

    ``dedup_key`` is unique, so the same firing/resolved notification of an incident is
    queued at most once per webhook and rule. The dispatcher groups due rows by
    ``(webhook_id, group_key)`` into one Alertmanager payload.
    """

    __tablename__ = "alert_outbox"
    __table_args__ = (Index("ix_alert_outbox_due", "status", "next_attempt_ns"),
                      Index("ix_alert_outbox_claimable", "status", "next_attempt_ns", "lease_until_ns"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"), index=True)
    incident_id: Mapped[int] = mapped_column(Integer, index=True)
    rule_id: Mapped[int] = mapped_column(Integer)
    dedup_key: Mapped[str] = mapped_column(String(300), unique=True)
    group_key: Mapped[str] = mapped_column(String(300))
    alert_status: Mapped[str] = mapped_column(String(20))
    """firing | resolved"""
    alert: Mapped[str] = mapped_column(Text)
    """JSON of one Alertmanager alert object."""
    status: Mapped[str] = mapped_column(String(20), default="pending")
    """pending | delivered | failed"""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    last_error: Mapped[str] = mapped_column(Text, default="")
    created_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    delivered_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    claim: Mapped[str] = mapped_column(String(100), default="")
    """Token of the dispatcher pass (replica) delivering the row now; '' when unclaimed."""
    lease_until_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    """The claim holds until then; past it any replica may claim the row again."""

    def to_dict(self) -> dict[str, Any]:
        d = {c.name: getattr(self, c.name) for c in self.__table__.columns}
        d["alert"] = json.loads(d["alert"])
        return d
