"""alert outbox claims: per-row lease so several server replicas share one outbox

Revision ID: 0003_alert_outbox_lease
Revises: 0002_diagnosis_alerts
Create Date: 2026-12-01

Other branches of this wave add their own 0003 revisions on top of 0002 as well;
``db.base.upgrade`` upgrades to ``heads``, so parallel revisions apply side by side.
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_alert_outbox_lease"
down_revision = "0002_diagnosis_alerts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("alert_outbox") as batch:
        batch.add_column(sa.Column("claim", sa.String(100), nullable=False, server_default=""))
        batch.add_column(sa.Column("lease_until_ns", sa.BigInteger, nullable=False, server_default="0"))
    op.create_index("ix_alert_outbox_claimable", "alert_outbox", ["status", "next_attempt_ns", "lease_until_ns"])


def downgrade() -> None:
    op.drop_index("ix_alert_outbox_claimable", table_name="alert_outbox")
    with op.batch_alter_table("alert_outbox") as batch:
        batch.drop_column("lease_until_ns")
        batch.drop_column("claim")
