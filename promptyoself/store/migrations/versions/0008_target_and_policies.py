"""A schedule knows where it goes and how it behaves when runs are missed or budgets run out.

- ``target``: the delivery target kind, ``letta`` (Letta's REST API, the default and every row
  before this migration) or ``letta-code`` (a Letta Code App Server over its WebSocket).
- ``conversation_id``: the target's conversation (Letta Code: ``default`` when NULL).
- ``catch_up``: the missed-run policy, ``skip`` | ``latest`` (default) | ``all``.
- ``max_per_day``: an optional per-schedule daily delivery budget (NULL: only the agent's budget).
- ``schedule_value`` widens to 300 characters: RFC 5545 rules in their normal form can be longer
  than a cron line.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("target", sa.String(16), nullable=False, server_default="letta"))
        batch.add_column(sa.Column("conversation_id", sa.String(200), nullable=True))
        batch.add_column(sa.Column("catch_up", sa.String(8), nullable=False, server_default="latest"))
        batch.add_column(sa.Column("max_per_day", sa.Integer(), nullable=True))
    if not _sqlite():  # SQLite keeps any length; altering a column there would copy the table and lose 0003's triggers
        op.alter_column("schedules", "schedule_value", existing_type=sa.String(100), type_=sa.String(300),
                        existing_nullable=False)


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def downgrade() -> None:
    if not _sqlite():
        op.alter_column("schedules", "schedule_value", existing_type=sa.String(300), type_=sa.String(100),
                        existing_nullable=False)
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("max_per_day")
        batch.drop_column("catch_up")
        batch.drop_column("conversation_id")
        batch.drop_column("target")
