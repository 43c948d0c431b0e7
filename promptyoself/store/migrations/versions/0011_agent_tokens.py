"""Agent tokens: credentials bound to one agent, kept as SHA-256 hashes (issue 29 item 10).

``promptyoself letta install-tools`` and ``promptyoself token mint`` make one per agent; a request that
carries one acts as that agent only (its own schedules; never approvals, policy or another agent).
The token itself is never stored: 32 random bytes cannot be guessed, so a fast hash is as safe as a
slow one here and lets a request be matched through the unique index on the hash.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agent_tokens",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("agent_id", sa.String(100), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("hint", sa.String(24), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ux_agent_tokens_hash", "agent_tokens", ["token_hash"], unique=True)
    op.create_index("ix_agent_tokens_agent", "agent_tokens", ["agent_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_agent_tokens_agent", table_name="agent_tokens")
    op.drop_index("ux_agent_tokens_hash", table_name="agent_tokens")
    op.drop_table("agent_tokens")
