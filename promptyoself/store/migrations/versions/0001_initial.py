"""Initial schema: schedules, deliveries, worker leases.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from promptyoself.store.db import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("agent_id", sa.String(100), nullable=False),
        sa.Column("prompt_text", sa.Text(), nullable=False),
        sa.Column("schedule_type", sa.String(16), nullable=False),
        sa.Column("schedule_value", sa.String(100), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("next_run", UTCDateTime(), nullable=True),
        sa.Column("due_at", UTCDateTime(), nullable=True),
        sa.Column("anchor", UTCDateTime(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("last_run", UTCDateTime(), nullable=True),
        sa.Column("max_repetitions", sa.Integer(), nullable=True),
        sa.Column("repetition_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.Column("claimed_by", sa.String(200), nullable=True),
        sa.Column("claim_until", UTCDateTime(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"),
    )
    op.create_index("ix_schedules_state_due", "schedules", ["state", "due_at"])
    op.create_index("ix_schedules_agent", "schedules", ["agent_id", "id"])
    op.create_index("ux_schedules_idempotency", "schedules", ["agent_id", "idempotency_key"], unique=True)
    op.create_table(
        "deliveries",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "schedule_id",
            sa.Integer(),
            sa.ForeignKey("schedules.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("agent_id", sa.String(100), nullable=False),
        sa.Column("scheduled_for", UTCDateTime(), nullable=False),
        sa.Column("attempted_at", UTCDateTime(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("letta_run_id", sa.String(100), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("lateness_s", sa.Float(), nullable=True),
    )
    op.create_index("ix_deliveries_schedule", "deliveries", ["schedule_id", "id"])
    op.create_index("ix_deliveries_agent", "deliveries", ["agent_id", "id"])
    op.create_table(
        "worker_leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("heartbeat_at", UTCDateTime(), nullable=False),
        sa.Column("lease_until", UTCDateTime(), nullable=False),
        sa.Column("info", sa.Text(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("worker_leases")
    op.drop_index("ix_deliveries_agent", "deliveries")
    op.drop_index("ix_deliveries_schedule", "deliveries")
    op.drop_table("deliveries")
    op.drop_index("ux_schedules_idempotency", "schedules")
    op.drop_index("ix_schedules_agent", "schedules")
    op.drop_index("ix_schedules_state_due", "schedules")
    op.drop_table("schedules")
