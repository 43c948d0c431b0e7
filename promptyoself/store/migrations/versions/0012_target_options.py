"""A schedule's target-specific values (issue 31): ``target_options``, a small JSON object the
schedule's target reads at delivery (``Occurrence.options``): a webhook's ``endpoint`` name, a Claude
Code schedule's ``session_id`` and ``cwd``. NULL for Letta and Letta Code schedules (and every row
before this migration). ``target`` itself (String(16)) already holds ``claude-code`` and ``webhook``.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("target_options", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("target_options")
