"""The console's sessions live in the database, so signing out survives a restart (issue 29 item 5).

One row per signed-in console session: the SHA-256 of its id (the cookie holds the id, signed; the
table never holds a usable credential), when it was made and when it expires. Signing out deletes the
row; "sign out everywhere" deletes them all; a cookie whose row is gone is no session, whichever
process or restart reads it.

Revision ID: 0010
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_console_sessions_expires", "console_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_console_sessions_expires", "console_sessions")
    op.drop_table("console_sessions")
