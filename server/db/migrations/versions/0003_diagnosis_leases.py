"""per-job diagnosis leases (two workers never diagnose one job at once)

Revision ID: 0003_diagnosis_leases
Revises: 0002_diagnosis_alerts
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_diagnosis_leases"
down_revision = "0002_diagnosis_alerts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "diagnosis_leases",
        sa.Column("job", sa.String(200), primary_key=True),
        sa.Column("owner", sa.String(200), nullable=False, server_default=""),
        sa.Column("expires_ns", sa.BigInteger, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("diagnosis_leases")
