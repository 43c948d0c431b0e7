"""Failure alerts and auto-pause (issue 43 point 4): ``schedules.failures_in_row`` (failed occurrences
in a row; delivery pauses a schedule at the policy's ``pause_after_failures``) and the ``alerts`` table
(one row per alert: the console's banner, ``/metrics``, and the signed POST to the operator's alert
endpoint, sent once per alert id by the delivery loop).

Revision ID: 0013_alerts
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_alerts"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("failures_in_row", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "alerts",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=True),
        sa.Column("agent_id", sa.String(100), nullable=True),
        sa.Column("target", sa.String(16), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("send_state", sa.String(16), nullable=False, server_default="pending"),
        sa.Column("send_attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_send_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sending_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("send_error", sa.Text(), nullable=True),
    )
    op.create_index("ix_alerts_send", "alerts", ["send_state", "next_send_at"])
    op.create_index("ix_alerts_created", "alerts", ["created_at"])
    op.create_index("ix_alerts_open", "alerts", ["kind", "target", "closed_at"])


def downgrade() -> None:
    op.drop_table("alerts")
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("failures_in_row")
