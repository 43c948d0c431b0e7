"""Cost budgets (issue 43 point 2): what a delivered turn cost, as numbers on its history row, so that
an agent's tokens and USD of the budget day are one aggregate read over its rows of the day (through
``ix_deliveries_agent``, from the day's first id), in the claim's transaction beside the day's counts.

- ``deliveries.tokens``: the receipt's input plus output tokens;
- ``deliveries.cost_usd``: the receipt's cost in USD.

Both written when the receipt is complete (with the ``delivered`` row, or later by the receipt task);
NULL when the target reported none, on every other row, and on the rows before this migration.

Revision ID: 0014_cost
Revises: 0013_alerts
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_cost"
down_revision = "0013_alerts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.add_column(sa.Column("tokens", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("cost_usd", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("cost_usd")
        batch.drop_column("tokens")
