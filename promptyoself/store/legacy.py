"""Reading the earlier PromptYoSelf's database (``import-legacy``): its one table,
``unified_reminders``, read-only with the standard library's ``sqlite3``. The file is never changed.
The core (``promptyoself.core.legacy``) turns the rows into schedules.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from promptyoself.errors import InvalidArgument

TABLE = "unified_reminders"
REQUIRED_COLUMNS = ("id", "message", "agent_id", "schedule_type", "schedule_value", "next_run")

LegacyRow = dict[str, object]
"""One ``unified_reminders`` row, column name -> value as SQLite holds it (text decoded leniently)."""


def read_reminders(file: Path, shown: str) -> list[LegacyRow]:
    """Every row of ``unified_reminders`` in ``file`` (opened read-only), in id order. Raises
    InvalidArgument (naming the file as ``shown``) when it is not a readable SQLite database, has no
    such table, or lacks one of ``REQUIRED_COLUMNS``."""
    try:
        conn = sqlite3.connect(f"file:{quote(str(file))}?mode=ro", uri=True, timeout=10)
        conn.row_factory = sqlite3.Row
        conn.text_factory = lambda raw: raw.decode("utf-8", "replace")  # one bad byte spoils no row
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    except sqlite3.Error as exc:
        raise InvalidArgument(
            f"{shown!r} is not a readable SQLite database ({exc.__class__.__name__}: {exc})."
        ) from None
    try:
        if TABLE not in names:
            found = ", ".join(sorted(names)[:10]) or "none"
            raise InvalidArgument(
                f"{shown!r} has no table '{TABLE}', so it is not a database written by the earlier "
                f"PromptYoSelf (tables found: {found})."
            )
        columns = {r[1] for r in conn.execute(f"PRAGMA table_info({TABLE})")}
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise InvalidArgument(
                f"Table '{TABLE}' in {shown!r} lacks the column(s) {', '.join(missing)}; it does not "
                "look like the earlier PromptYoSelf schema."
            )
        try:
            return [dict(r) for r in conn.execute(f"SELECT * FROM {TABLE} ORDER BY id")]
        except sqlite3.Error as exc:
            raise InvalidArgument(f"Cannot read table '{TABLE}' in {shown!r}: {exc}.") from None
    finally:
        conn.close()
