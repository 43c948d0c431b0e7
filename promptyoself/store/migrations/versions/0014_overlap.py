"""Overlap policy per schedule (issue 43 point 3): ``schedules.overlap``, what happens to an occurrence
due while the schedule's previous turn is still running: ``skip`` | ``queue`` | ``allow``. NULL (every
row before this migration) means the default of the schedule's target (its plug-in's
``default_overlap``); a new schedule stores the policy it was made with.

Revision ID: 0014_overlap
Revises: 0014_cost
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_overlap"
down_revision = "0014_cost"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("overlap", sa.String(8), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("overlap")
