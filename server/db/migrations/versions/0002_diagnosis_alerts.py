"""incidents, alert rules, webhooks and the alert outbox

Revision ID: 0002_diagnosis_alerts
Revises: 0001_jobs
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_diagnosis_alerts"
down_revision = "0001_jobs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "incidents",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job", sa.String(200), nullable=False),
        sa.Column("key", sa.String(300), nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("status", sa.String(20), nullable=False, server_default="open"),
        sa.Column("severity", sa.String(20), nullable=False, server_default="warning"),
        sa.Column("summary", sa.Text, nullable=False, server_default=""),
        sa.Column("ranks", sa.Text, nullable=False, server_default="[]"),
        sa.Column("hosts", sa.Text, nullable=False, server_default="[]"),
        sa.Column("group_id", sa.String(100), nullable=False, server_default=""),
        sa.Column("score", sa.Float, nullable=False, server_default="0"),
        sa.Column("est_slowdown", sa.Float, nullable=False, server_default="0"),
        sa.Column("first_step", sa.BigInteger, nullable=False, server_default="-1"),
        sa.Column("last_step", sa.BigInteger, nullable=False, server_default="-1"),
        sa.Column("evidence", sa.Text, nullable=False, server_default="{}"),
        sa.Column("opened_ns", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("updated_ns", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("last_seen_ns", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("resolved_ns", sa.BigInteger, nullable=True),
        sa.Column("acknowledged_ns", sa.BigInteger, nullable=True),
        sa.Column("acknowledged_by", sa.String(200), nullable=False, server_default=""),
        sa.Column("resolution", sa.Text, nullable=False, server_default=""),
        sa.Column("num_updates", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_index("ix_incidents_job", "incidents", ["job"])
    op.create_index("ix_incidents_kind", "incidents", ["kind"])
    op.create_index("ix_incidents_status", "incidents", ["status"])
    op.create_index("ix_incidents_job_key_status", "incidents", ["job", "key", "status"])
    op.create_table(
        "alert_rules",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("job", sa.String(200), nullable=False, server_default=""),
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("min_slowdown", sa.Float, nullable=False, server_default="0"),
        sa.Column("min_steps", sa.Integer, nullable=False, server_default="0"),
        sa.Column("min_mfu_drop", sa.Float, nullable=False, server_default="0"),
        sa.Column("severity", sa.String(20), nullable=False, server_default="warning"),
        sa.Column("builtin", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_ns", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("updated_ns", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("secret", sa.Text, nullable=False, server_default=""),
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("filter_jobs", sa.Text, nullable=False, server_default="[]"),
        sa.Column("filter_kinds", sa.Text, nullable=False, server_default="[]"),
        sa.Column("min_severity", sa.String(20), nullable=False, server_default="info"),
        sa.Column("timeout_s", sa.Float, nullable=False, server_default="5"),
        sa.Column("max_attempts", sa.Integer, nullable=False, server_default="12"),
        sa.Column("created_ns", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("updated_ns", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.create_table(
        "alert_outbox",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("webhook_id", sa.Integer, sa.ForeignKey("webhooks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("incident_id", sa.Integer, nullable=False),
        sa.Column("rule_id", sa.Integer, nullable=False),
        sa.Column("dedup_key", sa.String(300), nullable=False, unique=True),
        sa.Column("group_key", sa.String(300), nullable=False),
        sa.Column("alert_status", sa.String(20), nullable=False),
        sa.Column("alert", sa.Text, nullable=False),
        sa.Column("status", sa.String(20), nullable=False, server_default="pending"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_ns", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text, nullable=False, server_default=""),
        sa.Column("created_ns", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("delivered_ns", sa.BigInteger, nullable=True),
    )
    op.create_index("ix_alert_outbox_webhook_id", "alert_outbox", ["webhook_id"])
    op.create_index("ix_alert_outbox_incident_id", "alert_outbox", ["incident_id"])
    op.create_index("ix_alert_outbox_due", "alert_outbox", ["status", "next_attempt_ns"])


def downgrade() -> None:
    op.drop_table("alert_outbox")
    op.drop_table("webhooks")
    op.drop_table("alert_rules")
    op.drop_table("incidents")
