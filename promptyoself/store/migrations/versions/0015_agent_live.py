"""Partial index on each agent's live schedules: ``list`` of one agent, and its quota's count, in
O(its live schedules) instead of O(every schedule it ever had).

One agent's live page (``state IN ('active', 'paused', 'pending_approval') ORDER BY id``) walked
``ix_schedules_agent (agent_id, id)`` and read every row of the agent to test its state, ended ones
first (they are the oldest): with 50,000 ended schedules and 80 live ones, 87-113 ms on PostgreSQL
and 13-18 ms on SQLite per page. This index holds the live rows only (bounded by the operator's
``max_active_per_agent``), so it costs the writers little. The statements that use it name the states
as literals (``store.queries.LIVE_IN``): a planner can match a partial index only to a predicate it can
prove, and a bound parameter (PostgreSQL's generic plans, SQLite) proves nothing.

Revision ID: 0015_agent_live
Revises: 0014_overlap
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_agent_live"
down_revision = "0014_overlap"
branch_labels = None
depends_on = None

_WHERE = sa.text("state IN ('active', 'paused', 'pending_approval')")


def upgrade() -> None:
    op.create_index("ix_schedules_agent_live", "schedules", ["agent_id", "id"], postgresql_where=_WHERE,
                    sqlite_where=_WHERE)


def downgrade() -> None:
    op.drop_index("ix_schedules_agent_live", "schedules")
