"""jobs table

Revision ID: 0001_jobs
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0001_jobs"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("name", sa.String(400), nullable=False, server_default=""),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
        sa.Column("dp", sa.Integer, nullable=False, server_default="1"),
        sa.Column("tp", sa.Integer, nullable=False, server_default="1"),
        sa.Column("pp", sa.Integer, nullable=False, server_default="1"),
        sa.Column("order", sa.String(20), nullable=False, server_default="tp-dp-pp"),
        sa.Column("num_microbatches", sa.Integer, nullable=False, server_default="1"),
        sa.Column("model_flops_per_step", sa.Float, nullable=False, server_default="0"),
        sa.Column("device_name", sa.String(200), nullable=False, server_default=""),
        sa.Column("device_peak_flops", sa.Float, nullable=False, server_default="0"),
        sa.Column("start_ns", sa.BigInteger, nullable=True),
        sa.Column("end_ns", sa.BigInteger, nullable=True),
        sa.Column("status", sa.String(20), nullable=False, server_default="running"),
        sa.Column("command", sa.Text, nullable=False, server_default=""),
        sa.Column("versions", sa.Text, nullable=False, server_default="{}"),
        sa.Column("host", sa.String(200), nullable=False, server_default=""),
        sa.Column("updated_ns", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_status", table_name="jobs")
    op.drop_table("jobs")
