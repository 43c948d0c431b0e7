"""The hot path's statements run on psycopg directly (``promptyoself/store/direct.py``): the same rows
as through SQLAlchemy, in UTC whatever the session's time zone, inside the SQLAlchemy connection's
transaction, naive datetimes refused, and psycopg's errors raised as SQLAlchemy's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy.exc
from sqlalchemy import Integer, cast, literal, select

from promptyoself.store.claims import _ROWS_FOR_UPDATE, claim_due, lock_rows, next_due, write_schedules
from promptyoself.store.db import SCHEDULES, Store
from promptyoself.store.direct import Direct
from tests.helpers_delivery import add_schedule


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    s = Store(pg_url)
    yield s
    s.close()


def _due() -> datetime:
    return datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)


def test_rows_match_sqlalchemys_and_come_back_in_utc_whatever_the_session_zone(store: Store) -> None:
    ids = [add_schedule(store, f"agent-{i}", f"p{i}", _due()) for i in range(3)]
    with store.engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL TimeZone = 'Asia/Kolkata'")  # +05:30: psycopg answers in it
        direct = lock_rows(conn, ids, ["nobody"])
        through_sqlalchemy = {r.id: r._asdict() for r in conn.execute(_ROWS_FOR_UPDATE, {"ids": ids}).all()}
    assert direct == through_sqlalchemy and set(direct) == set(ids)
    for row in direct.values():
        assert row["next_run"].utcoffset() == timedelta(0) and row["next_run"].tzinfo is UTC
        assert row["created_at"].tzinfo is UTC


def test_claims_read_back_the_same_as_the_table(store: Store) -> None:
    sid = add_schedule(store, "agent-x", "p", _due())
    now = datetime.now(UTC)
    [row] = claim_due(store, "owner-1", now, now + timedelta(seconds=60), limit=1)
    with store.engine.begin() as conn:
        stored = conn.execute(select(SCHEDULES).where(SCHEDULES.c.id == sid)).one()._asdict()
    assert row._asdict() == stored and row.claimed_by == "owner-1"
    assert next_due(store, now) is None  # the only due row is claimed now


def test_it_runs_inside_the_sqlalchemy_transaction(store: Store) -> None:
    sid = add_schedule(store, "agent-y", "p", _due())
    with pytest.raises(RuntimeError), store.engine.begin() as conn:
        write_schedules(conn, [(sid, {"state": "paused"})])
        assert lock_rows(conn, [sid], ["x"])[sid]["state"] == "paused"  # seen in its own transaction
        raise RuntimeError("roll it back")
    with store.engine.begin() as conn:
        assert lock_rows(conn, [sid], ["x"])[sid]["state"] == "active"


def test_a_naive_datetime_is_refused_like_sqlalchemys_type_does(store: Store) -> None:
    with pytest.raises(ValueError, match="naive"):
        next_due(store, datetime.now())  # noqa: DTZ005 (the point of the test)
    with store.engine.begin() as conn, pytest.raises(ValueError, match="naive"):
        write_schedules(conn, [(1, {"due_at": datetime.now()}), (2, {"due_at": datetime.now(UTC)})])  # noqa: DTZ005


def test_a_database_error_comes_out_as_sqlalchemys(store: Store) -> None:
    bad = Direct(select(cast(literal("not a number"), Integer)))
    with pytest.raises(sqlalchemy.exc.DataError), store.engine.begin() as conn:
        bad.rows(conn, {})
    with store.engine.begin() as conn:  # the pool's connection is still good
        assert Direct(select(literal(1) + 1)).rows(conn, {})[0][0] == 2
