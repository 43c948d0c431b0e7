"""Receipts (issue 43 point 1): what a delivered turn did, as its target reported it, on the history
row that delivered it. ``receipt`` is a bounded JSON object (``targets.base.Receipt``: reply excerpt,
tools, steps, tokens, cost, ...); ``receipt_state`` is its state (``complete``, ``pending``, ``none``,
``timed_out``), a column of its own so that the pending ones (read later from the target) are found
by an index. NULL on every row that is not a delivery, and on the rows before this migration.

Revision ID: 0013
Revises: 0009 (the head before it: the chain landed 0008, 0010, 0011, 0012, 0009)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.add_column(sa.Column("receipt_state", sa.String(16), nullable=True))
        batch.add_column(sa.Column("receipt", sa.Text(), nullable=True))
    op.create_index("ix_deliveries_receipt_state", "deliveries", ["receipt_state", "id"])


def downgrade() -> None:
    op.drop_index("ix_deliveries_receipt_state", table_name="deliveries")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("receipt")
        batch.drop_column("receipt_state")
