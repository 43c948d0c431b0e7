"""Schedules made through Letta's scheduling API keep the request's payload.

``letta_payload`` holds JSON: ``{"messages": [...], "callback_url"?, "include_return_message_types"?,
"max_steps"?}`` as the ``letta-client`` SDK sent it. Delivery passes it on to Letta's async message
route instead of the text envelope; NULL for every other schedule.

Revision ID: 0005
Revises: 0003 (the integrator re-chains it after 0004)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("letta_payload", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("letta_payload")
