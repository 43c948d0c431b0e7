"""Read queries on the hot path of ``list``: one page of schedules and the exact total.

Statements are built once (bound parameters only), run on a plain connection (no ORM session or
identity map) and select just the columns a schedule record shows. What makes them fast at 100,000
schedules (bench/latency.py measures it):

- a page of live schedules uses ``ix_schedules_state_id (state, id)``: for ``state IN (...) ORDER BY
  id LIMIT n`` SQLite reads at most offset+n entries per state instead of sorting every live row;
- one agent's live page and its count use the partial ``ix_schedules_agent_live (agent_id, id) WHERE
  state IN (live)`` (0015; the states as literals, ``db.LIVE_IN``): O(its live schedules), however many
  ended ones it has; the count is a window over those rows in the page's statement (one round trip);
- one agent's page with the ended ones uses ``ix_schedules_agent (agent_id, id)``: the page stops after
  ``limit`` rows, the count reads the index only;
- PostgreSQL reads run in autocommit (``reading``): no BEGIN and COMMIT round trips around them;
- the total is not counted at all when the page itself shows it (a short page);
- the all-agents total is read from ``schedule_state_counts``, which triggers keep exact in the
  writer's own transaction: O(1) instead of visiting every live row. SQLite has one row per state
  (migration 0003). PostgreSQL has one row per state and writing backend (migration 0007), so that
  concurrent writers never wait on each other's counter rows; a state's count is the sum of its rows,
  and ``fold_state_counts`` merges the rows of past sessions when a read sees too many of them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Integer,
    MetaData,
    Select,
    String,
    Table,
    bindparam,
    delete,
    func,
    select,
    text,
    tuple_,
)
from sqlalchemy.exc import SQLAlchemyError

from promptyoself.store import LIVE_STATES
from promptyoself.store.db import LIVE_IN, Schedule, Store
from promptyoself.store.records import ListedSchedule, column_names

log = logging.getLogger(__name__)

_t = Schedule.__table__
_COLUMNS = [_t.c[name] for name in column_names(ListedSchedule)]  # a schedule record's columns
if column_names(ListedSchedule) != tuple(f.name for f in fields(ListedSchedule)):  # list_page builds by position
    raise TypeError("ListedSchedule: every field must be a column, in the order list_page selects them")


def _page(by_agent: bool, live_only: bool) -> Select[Any]:
    # one agent's live page carries its total: a window count over its live rows (at most the quota;
    # ix_schedules_agent_live), one statement where a page and a count were two. Not with the ended ones
    # too: the window would read every row the agent ever had, where the page stops after `lim` and the
    # count reads the index only.
    q = select(*_COLUMNS, func.count().over()) if by_agent and live_only else select(*_COLUMNS)
    if by_agent:
        q = q.where(_t.c.agent_id == bindparam("agent"))
    if live_only:  # one agent's: ix_schedules_agent_live (0015) needs the states as literals
        q = q.where(LIVE_IN if by_agent else _t.c.state.in_(LIVE_STATES))
    return q.order_by(_t.c.id).limit(bindparam("lim")).offset(bindparam("off"))


def _count(*conds: Any) -> Select[Any]:
    return select(func.count()).select_from(_t).where(*conds)


_PAGES = {(a, b): _page(a, b) for a in (False, True) for b in (False, True)}
_COUNT_AGENT = _count(_t.c.agent_id == bindparam("agent"))
_COUNT_AGENT_LIVE = _count(_t.c.agent_id == bindparam("agent"), LIVE_IN)

STATE_COUNTS = Table(
    "schedule_state_counts",
    MetaData(),
    Column("state", String(16), primary_key=True),
    Column("shard", Integer, primary_key=True),  # PostgreSQL only (0007): the writer's backend pid, 0 = folded
    Column("n", BigInteger),
)
"""Schedules per state, kept exact by triggers (SQLite: migration 0003, one row per state; PostgreSQL:
migration 0007, one row per state and shard). Not in Base.metadata: triggers own it. The statements
that run on both dialects name only ``state`` and ``n``."""
_SC = STATE_COUNTS.c
_STATE_SUMS = select(_SC.state, func.sum(_SC.n), func.count()).group_by(_SC.state)
"""Per state: the count and how many counter rows hold it (one on SQLite)."""

FOLD_AT = 64
"""PostgreSQL: a read that sees more counter rows than this folds them (``fold_state_counts``)."""
_FOLD_LOCK_TIMEOUT = text("SET LOCAL lock_timeout = '200ms'")
_FOLD_LOCK = select(_SC.state, _SC.shard).where(_SC.shard != 0).with_for_update(skip_locked=True)
_FOLD_TAKE = (
    delete(STATE_COUNTS)
    .where(tuple_(_SC.state, _SC.shard).in_(bindparam("keys", expanding=True)))
    .returning(_SC.state, _SC.n)
)


@cache
def _fold_add() -> Any:
    """PostgreSQL's upsert of a shard-0 count, built once on first use: importing the PostgreSQL dialect
    costs a SQLite process (a CLI call) ~20 ms for a statement it never runs."""
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    add = pg_insert(STATE_COUNTS).values(state=bindparam("state"), shard=0, n=bindparam("n"))
    return add.on_conflict_do_update(index_elements=[_SC.state, _SC.shard], set_={"n": _SC.n + add.excluded.n})


def fold_state_counts(store: Store) -> int:
    """PostgreSQL: merge the counter rows of every shard into shard 0 (one row per state), in one short
    transaction of its own. Returns how many rows it merged. Sessions may write meanwhile.

    Why nothing is lost or counted twice (READ COMMITTED):

    1. ``SELECT ... FOR UPDATE SKIP LOCKED`` locks the shard rows no open transaction has written.
       Under READ COMMITTED a row updated by a transaction that committed after this statement began
       is locked in its newest version. A row an open transaction has written is skipped: its writer
       may still commit or roll back, so it stays as it is, for a later fold. Nothing here waits for a
       writer.
    2. The DELETE runs with a snapshot taken after those locks were granted, and nobody can change a
       locked row until this transaction ends, so RETURNING gives each row's final value, exactly once.
       Rows inserted after step 1 (a writer's first write since the last fold) are not in ``keys``
       and are left alone.
    3. The sums are added to the shard-0 rows, in state order. Only folds write shard 0 (a backend
       pid is never 0), so this waits at most for another fold, never for a writer, and two folds
       lock shard-0 rows in the same order (no deadlock).
    4. Commit: the deleted rows and the added sums become visible at once, so a reader sees every
       schedule counted once before the fold or once after it. A writer whose row was deleted here
       and not yet committed waits for this commit (its ``ON CONFLICT`` check meets the deleted row),
       then finds no row and inserts a fresh one with its own delta: nothing lost. If this
       transaction fails, it rolls back as a whole and the rows are as they were.
    """
    with store.engine.begin() as conn:
        conn.execute(_FOLD_LOCK_TIMEOUT)  # guards step 3 (another fold holding shard 0)
        keys = [(str(state), int(shard)) for state, shard in conn.execute(_FOLD_LOCK)]
        if not keys:
            return 0
        sums: dict[str, int] = {}
        for state, n in conn.execute(_FOLD_TAKE, {"keys": keys}):
            sums[state] = sums.get(state, 0) + int(n)
        for state in sorted(sums):
            if sums[state]:
                conn.execute(_fold_add(), {"state": state, "n": sums[state]})
    return len(keys)


@contextmanager
def reading(store: Store) -> Iterator[Connection]:
    """A connection for reads that need no transaction of their own. PostgreSQL: in autocommit, so a
    read costs its statements' round trips and no BEGIN and COMMIT around them (under READ COMMITTED each
    statement has its own snapshot in a transaction too; and no ROLLBACK drops psycopg's prepared
    statements, see make_engine). SQLite: in a transaction (``engine.begin``: in process, no round trip)."""
    if store.dialect == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            yield conn
    else:
        with store.engine.begin() as conn:  # reads too: see make_engine on ROLLBACK
            yield conn


def _listed(row: Sequence[Any]) -> ListedSchedule:
    """A selected row as its record: the columns in the record's field order (``column_names``)."""
    return ListedSchedule(**dict(zip(column_names(ListedSchedule), row, strict=False)))


def list_page(
    store: Store, agent_id: str | None, include_ended: bool, limit: int, offset: int
) -> tuple[list[ListedSchedule], int]:
    """One page of schedules and the exact total."""
    params = {"agent": agent_id, "lim": limit, "off": offset}
    with reading(store) as conn:
        result = conn.execute(_PAGES[(agent_id is not None, not include_ended)], params)
        if agent_id is not None and not include_ended:
            got = result.all()
            rows = [_listed(r) for r in got]  # the page's columns, then the total
            if got:
                return rows, int(got[0][-1])
            if offset == 0:
                return rows, 0
            return rows, int(conn.execute(_COUNT_AGENT_LIVE, params).scalar_one())  # past the end
        rows = [_listed(r) for r in result]
        if (rows and len(rows) < limit) or (not rows and offset == 0):
            return rows, offset + len(rows)
        if agent_id is not None:
            return rows, int(conn.execute(_COUNT_AGENT, params).scalar_one())
        total = counter_rows = 0
        for state, n, held_in in conn.execute(_STATE_SUMS):
            counter_rows += int(held_in)
            if include_ended or state in LIVE_STATES:
                total += int(n)
    if counter_rows > FOLD_AT and store.dialect == "postgresql":
        try:  # best effort: the total above is exact either way; the fold only keeps the next read short
            fold_state_counts(store)
        except SQLAlchemyError:
            log.debug("folding the schedule state counters failed", exc_info=True)
    return rows, total
