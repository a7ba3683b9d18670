"""Join the four wave-2 revisions written in parallel on 0002 into one head.

Revision ID: 0004_merge_wave2
Revises: 0003_alert_outbox_lease, 0003_api_tokens, 0003_diagnosis_leases, 0003_instrumentation
"""

from __future__ import annotations

revision = "0004_merge_wave2"
down_revision = (
    "0003_alert_outbox_lease",
    "0003_api_tokens",
    "0003_diagnosis_leases",
    "0003_instrumentation",
)
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Nothing to change: this revision only gives later migrations one parent."""


def downgrade() -> None:
    """Nothing to undo."""
