"""The delivery hot path's statements on PostgreSQL, run on psycopg 3 directly.

Each delivery costs the worker a share of about one statement (claims and records go in batches).
Through SQLAlchemy's ``Connection.execute`` a statement cost ~0.25 ms of the worker's CPU beyond
psycopg's own: the compiled-cache lookup, an execution context, parameter and result processing, a
``Row`` per row. At a thousand deliveries a second that was a third of the worker's CPU. A
``Direct`` statement is the same SQLAlchemy Core construct, compiled once for the connection's
dialect; it runs on the psycopg connection under the SQLAlchemy one, so inside that connection's
transaction (committed or rolled back by it), and a psycopg error comes out as SQLAlchemy's
exception for it (``DBAPIError.instance``), as from ``Connection.execute``.

What SQLAlchemy's ``UTCDateTime`` did on the way is done here too: a naive datetime parameter is
refused, and every ``timestamptz`` value read comes back in UTC. Rows are named tuples (``row.id``,
``row._asdict()``). Only for ``postgresql+psycopg`` (``claims._unnests``): SQLite and psycopg2 keep
``Connection.execute``.
"""

from __future__ import annotations

from collections import namedtuple
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import DBAPIError

from promptyoself.store.db import refuse_naive

TIMESTAMPTZ_OID = 1184
"""PostgreSQL's type oid of ``timestamp with time zone``."""


class Direct:
    """One statement (a SQLAlchemy Core construct with named bind parameters, no expanding IN),
    compiled on first use for the connection's dialect."""

    __slots__ = ("_defaults", "_dt", "_row", "_sql", "stmt")

    def __init__(self, stmt: Any) -> None:
        self.stmt = stmt
        self._sql: str | None = None
        self._defaults: dict[str, Any] = {}
        self._row: Any = None  # the named tuple of its result rows, made from the first result
        self._dt: list[int] = []  # the timestamptz columns of its result

    def rows(self, conn: Any, params: dict[str, Any]) -> list[Any]:
        """Run it in ``conn``'s transaction; its result rows."""
        cur = self._execute(conn, params)
        with cur:
            data = cur.fetchall()
            if self._row is None:
                desc = cur.description or []
                self._dt = [i for i, d in enumerate(desc) if d.type_code == TIMESTAMPTZ_OID]
                self._row = namedtuple("Record", [d.name for d in desc], rename=True)  # type: ignore[misc]
        make, dt = self._row._make, self._dt
        if not dt:
            return [make(r) for r in data]
        out = []
        for r in data:
            values = list(r)
            for i in dt:
                v = values[i]
                if v is not None:
                    values[i] = v.astimezone(UTC)
            out.append(make(values))
        return out

    def run(self, conn: Any, params: dict[str, Any]) -> int:
        """Run it in ``conn``'s transaction; the number of rows it changed."""
        with self._execute(conn, params) as cur:
            return int(cur.rowcount)

    def _execute(self, conn: Any, params: dict[str, Any]) -> Any:
        sql = self._sql
        if sql is None:
            compiled = self.stmt.compile(dialect=conn.dialect)
            self._defaults = {k: v for k, v in compiled.params.items() if v is not None}
            sql = self._sql = compiled.string
        args = {**self._defaults, **params}
        for value in args.values():
            _aware(value)
        cur = conn.connection.driver_connection.cursor()
        try:
            cur.execute(sql, args)
        except Exception as exc:
            cur.close()
            dbapi = conn.dialect.loaded_dbapi
            if isinstance(exc, dbapi.Error):
                raise DBAPIError.instance(sql, args, exc, dbapi.Error, dialect=conn.dialect) from exc
            raise
        return cur


def _aware(value: Any) -> None:
    """Refuse a naive datetime, alone or in a list (as ``UTCDateTime`` does)."""
    if isinstance(value, datetime):
        refuse_naive(value)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, datetime):
                refuse_naive(item)
