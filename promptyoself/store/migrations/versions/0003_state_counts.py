"""SQLite: schedules per state, kept by triggers, so that ``list`` across agents has an O(1) total.

``count(*) WHERE state IN ('active', 'paused')`` visits every live row's index entry (milliseconds
at 100,000 schedules, measured by bench/latency.py). The triggers keep ``schedule_state_counts`` exact
in the same transaction as every insert, state change and delete, whoever writes. SQLite has one
writer at a time, so the counter rows cost nothing in concurrency. PostgreSQL gets none of this here:
with one row per state, every delivery worker would queue on the counter rows' locks. Migration 0007
gives it the same table with one row per state and writing session instead.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_BUMP = (
    "INSERT INTO schedule_state_counts (state, n) VALUES ({state}, {delta}) "
    "ON CONFLICT(state) DO UPDATE SET n = n + {delta};"
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.create_table(
        "schedule_state_counts",
        sa.Column("state", sa.String(16), primary_key=True),
        sa.Column("n", sa.Integer(), nullable=False),
    )
    op.execute("INSERT INTO schedule_state_counts (state, n) SELECT state, count(*) FROM schedules GROUP BY state")
    op.execute(
        "CREATE TRIGGER tr_schedules_count_insert AFTER INSERT ON schedules BEGIN "
        + _BUMP.format(state="NEW.state", delta=1)
        + " END"
    )
    op.execute(
        "CREATE TRIGGER tr_schedules_count_update AFTER UPDATE OF state ON schedules "
        "WHEN OLD.state IS NOT NEW.state BEGIN "
        + _BUMP.format(state="OLD.state", delta=-1)
        + " "
        + _BUMP.format(state="NEW.state", delta=1)
        + " END"
    )
    op.execute(
        "CREATE TRIGGER tr_schedules_count_delete AFTER DELETE ON schedules BEGIN "
        + _BUMP.format(state="OLD.state", delta=-1)
        + " END"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for name in ("tr_schedules_count_delete", "tr_schedules_count_update", "tr_schedules_count_insert"):
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_table("schedule_state_counts")
