"""The operator's policy lives in the database, and pass-through sends are counted (issues 29, 32).

- ``policy``: one row per guardrail (``max_deliveries_per_agent_per_day``,
  ``max_schedules_per_agent_per_hour``, ``approval_below``, ``max_active_per_agent``), its value as
  text, where it came from (``operator``: set with ``promptyoself policy set``, the console or
  ``PUT /api/policy``; ``environment``: seeded from the first process's environment; ``default``)
  and when. Every writer reads these values, whatever its own environment says.
- ``passthrough_sends``: one row per message an agent sent to Letta through the pass-through
  (``PROMPTYOSELF_LETTA_PROXY``), so that it counts against the agent's daily delivery budget.

Revision ID: 0009
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "policy",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(64), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "passthrough_sends",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("agent_id", sa.String(100), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("route", sa.String(200), nullable=False),
    )
    op.create_index("ix_passthrough_agent", "passthrough_sends", ["agent_id", "sent_at"])


def downgrade() -> None:
    op.drop_index("ix_passthrough_agent", table_name="passthrough_sends")
    op.drop_table("passthrough_sends")
    op.drop_table("policy")
