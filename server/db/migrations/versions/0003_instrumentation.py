"""instrumentation levels (runtime control)

Revision ID: 0003_instrumentation
Revises: 0002_diagnosis_alerts
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_instrumentation"
down_revision = "0002_diagnosis_alerts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "instrumentation",
        sa.Column("job", sa.String(200), primary_key=True),
        sa.Column("level", sa.String(20), nullable=False, server_default="full"),
        sa.Column("ranks", sa.Text, nullable=False, server_default="{}"),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("updated_ns", sa.BigInteger, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("instrumentation")
