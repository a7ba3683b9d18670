"""scoped API tokens; incident list index for paged listings

Revision ID: 0003_api_tokens
Revises: 0002_diagnosis_alerts
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_api_tokens"
down_revision = "0002_diagnosis_alerts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False, server_default=""),
        sa.Column("prefix", sa.String(16), nullable=False, server_default=""),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("scope", sa.String(20), nullable=False),
        sa.Column("jobs", sa.Text, nullable=False, server_default="[]"),
        sa.Column("hosts", sa.Text, nullable=False, server_default="[]"),
        sa.Column("created_ns", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("revoked_ns", sa.BigInteger, nullable=True),
    )
    # GET /incidents pages newest first, optionally by status: both served by an index
    op.create_index("ix_incidents_opened", "incidents", ["opened_ns", "id"])
    op.create_index("ix_incidents_status_opened", "incidents", ["status", "opened_ns", "id"])


def downgrade() -> None:
    op.drop_index("ix_incidents_status_opened", "incidents")
    op.drop_index("ix_incidents_opened", "incidents")
    op.drop_table("api_tokens")
