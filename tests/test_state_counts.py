"""``schedule_state_counts`` (SQLite: migration 0003; PostgreSQL: migration 0007) equals a real
``count(*) GROUP BY state`` after every kind of write, on both databases, and ``list``'s all-agents
total agrees with it. On PostgreSQL also: one counter write per state a statement changes, none for
claims; two sessions writing at once never wait on each other's counter rows; folding the rows of
past sessions (``fold_state_counts``) loses nothing while others write, and a failed fold never fails
``list``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from itertools import cycle
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, delete, func, insert, select, text, update

from promptyoself.faces.delivery import run_once_result
from promptyoself.store import db as store_module
from promptyoself.store import queries
from promptyoself.store.claims import claim_due, release_claims, renew_claims
from promptyoself.store.db import Schedule, Store, make_engine
from promptyoself.store.queries import FOLD_AT, LIVE_STATES, fold_state_counts, list_page
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import T0, Clock, add_schedule, make_core

STATES = ("active", "paused", "completed", "cancelled", "failed")
S = Schedule.__table__


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'counts.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    s = Store(url)
    yield s
    s.close()


def row(state: str = "active", agent: str = "agent-0", i: int = 0) -> dict[str, Any]:
    due = T0 + timedelta(minutes=i + 1)
    return {
        "agent_id": agent, "prompt_text": f"p{i}", "schedule_type": "once", "schedule_value": "x",
        "timezone": "UTC", "next_run": due, "due_at": due if state == "active" else None, "state": state,
        "created_at": T0, "updated_at": T0, "repetition_count": 0, "attempt": 0,
    }


def real(conn: Connection) -> dict[str, int]:
    return {s: int(n) for s, n in conn.execute(text("SELECT state, count(*) FROM schedules GROUP BY state"))}


def kept(conn: Connection) -> dict[str, int]:
    return {s: int(n) for s, n in conn.execute(text(
        "SELECT state, sum(n) FROM schedule_state_counts GROUP BY state HAVING sum(n) <> 0"))}


def counter_rows(conn: Connection) -> list[tuple[Any, ...]]:
    """Every counter row with its row version (PostgreSQL's xmin): equal lists = nothing written."""
    if conn.dialect.name == "postgresql":
        q = "SELECT state, shard, n, xmin::text FROM schedule_state_counts ORDER BY state, shard"
    else:
        q = "SELECT state, n FROM schedule_state_counts ORDER BY state"
    return [tuple(r) for r in conn.execute(text(q))]


def check(store: Store) -> dict[str, int]:
    """The counters equal the rows, and list's all-agents totals equal count(*)."""
    with store.engine.connect() as conn:
        actual = real(conn)
        assert kept(conn) == actual
    live = sum(n for s, n in actual.items() if s in LIVE_STATES)
    assert list_page(store, None, False, 1, 0)[1] == live
    assert list_page(store, None, True, 1, 0)[1] == sum(actual.values())
    return actual


def counter_writes(conn: Connection) -> int:
    """PostgreSQL: rows this backend has inserted + updated in schedule_state_counts and not yet
    reported to the statistics (this transaction's, and maybe earlier ones': take differences)."""
    return int(conn.execute(text(
        "SELECT coalesce(sum(n_tup_ins + n_tup_upd), 0) FROM pg_stat_xact_user_tables "
        "WHERE relname = 'schedule_state_counts' AND schemaname = current_schema()")).scalar_one())


def run(conn: Connection, stmt: Any, params: Any = None) -> int | None:
    """Execute ``stmt``; on PostgreSQL return how many counter rows it inserted or updated."""
    pg = conn.dialect.name == "postgresql"
    before = counter_writes(conn) if pg else 0
    conn.execute(stmt, params)
    return counter_writes(conn) - before if pg else None


# ---- every kind of write -------------------------------------------------------------------------


def test_inserts_single_and_multi_row(store: Store) -> None:
    assert check(store) == {}
    with store.engine.begin() as conn:
        conn.execute(insert(S).values(row("active")))
    assert check(store) == {"active": 1}
    with store.engine.begin() as conn:  # executemany
        conn.execute(insert(S), [row(s, i=i) for i, s in zip(range(40), cycle(STATES), strict=False)])
    assert check(store) == {s: 9 if s == "active" else 8 for s in STATES}
    with store.engine.begin() as conn:  # one multi-row VALUES statement: one counter write per state
        writes = run(conn, insert(S).values([row(s, i=i) for i, s in zip(range(30), cycle(STATES[:3]), strict=False)]))
        assert writes in (None, 3)
    assert check(store) == {"active": 19, "paused": 18, "completed": 18, "cancelled": 8, "failed": 8}


def test_state_changes_deletes_and_updates_that_change_no_state(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(insert(S).values([row(s, agent=f"agent-{i % 3}", i=i)
                                       for i, s in zip(range(60), cycle(STATES), strict=False)]))
    check(store)
    with store.engine.connect() as conn:
        ids = [int(i) for i in conn.execute(text("SELECT id FROM schedules ORDER BY id")).scalars()]
    with store.engine.begin() as conn:
        before = counter_rows(conn)
        # claims, renewals, retries: columns other than state, and state set to what it is
        assert run(conn, update(S).where(S.c.id.in_(ids[:20])).values(attempt=S.c.attempt + 1)) in (None, 0)
        assert run(conn, text("UPDATE schedules SET state = state")) in (None, 0)
        assert run(conn, update(S).where(S.c.id == ids[7]).values(claimed_by="w", claim_until=T0)) in (None, 0)
    with store.engine.connect() as conn:
        assert counter_rows(conn) == before
    with store.engine.begin() as conn:  # many rows, several states -> one, in one statement
        # active, paused, completed, failed down; cancelled up: five counter writes
        assert run(conn, update(S).where(S.c.id.in_(ids[:10])).values(state="cancelled")) in (None, 5)
    check(store)
    with store.engine.begin() as conn:  # two rows swap states: the sums cancel, nothing written
        swap = text("UPDATE schedules SET state = CASE WHEN id = :a THEN :sb ELSE :sa END WHERE id IN (:a, :b)")
        assert run(conn, swap, {"a": ids[11], "b": ids[12], "sa": STATES[1], "sb": STATES[2]}) in (None, 0)
    check(store)
    with store.engine.begin() as conn:
        conn.execute(update(S).where(S.c.id == ids[20]).values(state="paused"))
        conn.execute(delete(S).where(S.c.id == ids[21]))
        conn.execute(delete(S).where(S.c.id.in_(ids[30:45])))
    expected = check(store)
    with pytest.raises(RuntimeError), store.engine.begin() as conn:  # rolled back: counters unchanged
        conn.execute(update(S).values(state="failed"))
        conn.execute(delete(S).where(S.c.id.in_(ids[45:])))
        raise RuntimeError("rolled back")
    assert check(store) == expected


@pytest.mark.slow
def test_core_operations_claims_and_delivery(url: str) -> None:
    clock = Clock()
    with FakeLetta(agents=3) as fake:
        core = make_core(url, fake, clock=clock)
        try:
            a = fake.agent_ids
            made = [asyncio.run(core.scheduling.schedule_time(f"p{i}", "in 1h", agent_id=a[i % 3],
                                                              skip_validation=True))["id"]
                    for i in range(9)]
            due = [add_schedule(core.store, a[i], f"due {i}", T0) for i in range(3)]
            asyncio.run(core.scheduling.cancel(made[0]))
            asyncio.run(core.scheduling.pause(made[1]))
            asyncio.run(core.scheduling.resume(made[1]))
            asyncio.run(core.scheduling.pause(made[2]))
            assert check(core.store) == {"active": 10, "paused": 1, "cancelled": 1}
            with core.store.engine.connect() as conn:
                before = counter_rows(conn)
            now = clock()
            claimed = claim_due(core.store, "w", now, now + timedelta(seconds=5), limit=10)
            assert sorted(r.id for r in claimed) == due
            assert renew_claims(core.store, "w", due, now + timedelta(seconds=9)) == set(due)
            assert release_claims(core.store, "w", due) == 3
            with core.store.engine.connect() as conn:
                assert counter_rows(conn) == before  # claims change no state: no counter written
            executed = run_once_result(core)["executed"]
            assert sorted(e["id"] for e in executed) == due  # delivered: once -> completed
            assert check(core.store) == {"active": 7, "paused": 1, "cancelled": 1, "completed": 3}
        finally:
            core.close()


# ---- the migration over a database that has rows -------------------------------------------------


def _config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(store_module.__file__).with_name("migrations")))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _migrate(engine: Engine, url: str, to: str, down: bool = False) -> None:
    cfg = _config(url)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, to)


def test_migration_counts_the_rows_already_there(url: str) -> None:
    engine = make_engine(url)
    _migrate(engine, url, "0006")
    rows = [row(s, i=i) for i, s in enumerate(["active"] * 7 + ["paused"] * 2 + ["completed"] * 3 + ["failed"])]
    with engine.begin() as conn:
        conn.execute(insert(S), rows)
    engine.dispose()
    store = Store(url)  # opening migrates to head
    try:
        assert check(store) == {"active": 7, "paused": 2, "completed": 3, "failed": 1}
        if store.dialect != "postgresql":
            return
        with store.engine.connect() as conn:
            assert {int(s) for s in conn.execute(text("SELECT shard FROM schedule_state_counts")).scalars()} == {0}
        _migrate(store.engine, url, "0006", down=True)
        with store.engine.connect() as conn:
            left = conn.execute(text(
                "SELECT (SELECT count(*) FROM pg_trigger WHERE tgrelid = 'schedules'::regclass AND NOT tgisinternal)"
                " + (SELECT count(*) FROM pg_proc WHERE proname = 'schedules_count_states'"
                "    AND pronamespace = current_schema()::regnamespace)"
                " + (SELECT count(*) FROM pg_tables WHERE tablename = 'schedule_state_counts'"
                "    AND schemaname = current_schema())")).scalar_one()
            assert left == 0
        with store.engine.begin() as conn:
            conn.execute(update(S).where(S.c.state == "failed").values(state="active"))
        _migrate(store.engine, url, "head")
        assert check(store) == {"active": 8, "paused": 2, "completed": 3}
    finally:
        store.close()


# ---- concurrent writers, and folding while they write --------------------------------------------


def _writer(url: str, k: int, writes: int, errors: list[BaseException]) -> None:
    """``writes`` mixed writes on this thread's own schedules (agent ``t<k>``), each in its own
    transaction, over its own connections: a fresh one every 25 writes (a new PostgreSQL backend,
    hence new counter shards, as short-lived processes make)."""
    rng = random.Random(k)
    agent = f"t{k}"
    engine = make_engine(url)
    try:
        for i in range(writes):
            if i % 25 == 0:
                engine.dispose()
            with engine.connect() as conn:  # read the ids apart from the write (SQLite: no stale snapshot)
                ids = [int(x) for x in conn.execute(
                    text("SELECT id FROM schedules WHERE agent_id = :a"), {"a": agent}).scalars()]
            pick = rng.sample(ids, min(3, len(ids)))
            kind = rng.choice(("insert", "insert many", "state", "states", "no state", "delete"))
            with engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    conn.execute(text("SET LOCAL lock_timeout = '5s'"))  # a hang becomes an error
                if kind == "insert" or not pick:
                    conn.execute(insert(S).values(row(rng.choice(STATES), agent, i)))
                elif kind == "insert many":
                    conn.execute(insert(S).values([row(rng.choice(STATES), agent, i) for _ in range(3)]))
                elif kind == "state":
                    conn.execute(update(S).where(S.c.id == pick[0]).values(state=rng.choice(STATES)))
                elif kind == "states":
                    conn.execute(update(S).where(S.c.id.in_(pick)).values(state=rng.choice(STATES)))
                elif kind == "no state":
                    conn.execute(update(S).where(S.c.id.in_(pick)).values(attempt=S.c.attempt + 1))
                else:
                    conn.execute(delete(S).where(S.c.id == pick[0]))
    except BaseException as exc:
        errors.append(exc)
    finally:
        engine.dispose()


def test_concurrent_writers_then_a_fold(store: Store, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    folded: list[int] = []

    def fold(s: Store) -> int:
        folded.append(fold_state_counts(s))
        return folded[-1]

    monkeypatch.setattr(queries, "fold_state_counts", fold)
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_writer, args=(url, k, 200, errors)) for k in range(4)]
    for t in threads:
        t.start()
    lists = 0
    while any(t.is_alive() for t in threads):  # list (and fold, on PostgreSQL) while they write
        list_page(store, None, False, 1, 0)
        lists += 1
        time.sleep(0.01)
    for t in threads:
        t.join()
    assert not errors, errors
    assert lists > 0
    if store.dialect == "postgresql":  # 32 sessions' rows: list folded them while the writers ran
        assert sum(folded) > 0, folded
    actual = check(store)  # this list folds on PostgreSQL if the rows grew past FOLD_AT again
    assert sum(actual.values()) >= 4 * 5
    if store.dialect == "postgresql":
        fold_state_counts(store)  # nobody writes now: everything folds into shard 0
        with store.engine.connect() as conn:
            shards = [(s, int(h)) for s, h in conn.execute(text("SELECT state, shard FROM schedule_state_counts"))]
        assert len(shards) <= len(STATES) and {h for _, h in shards} <= {0}
        assert check(store) == actual


def _spread(url: str, sessions: int) -> None:
    """One insert from each of ``sessions`` fresh connections: a counter row per backend."""
    engine = make_engine(url)
    try:
        for i, state in zip(range(sessions), cycle(STATES), strict=False):
            engine.dispose()
            with engine.begin() as conn:
                conn.execute(insert(S).values(row(state, i=i)))
    finally:
        engine.dispose()


def _count_rows(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM schedule_state_counts")).scalar_one())


def _unfolded(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM schedule_state_counts WHERE shard <> 0")).scalar_one())


def test_pg_list_folds_past_sessions_and_skips_a_writer_in_flight(pg_url: str) -> None:
    store = Store(pg_url)
    try:
        _spread(pg_url, FOLD_AT + 16)
        assert _count_rows(store) > FOLD_AT
        with store.engine.connect() as a:
            a.execute(insert(S).values(row("paused", i=1000)))
            a.execute(update(S).where(S.c.state == "completed").values(state="failed"))
            a.commit()  # a's rows: paused, completed, failed
            # a writer in flight: a's paused and failed rows are locked, its cancelled row not yet visible
            a.execute(update(S).where(S.c.state == "failed").values(state="cancelled"))
            a.execute(insert(S).values(row("paused", i=1001)))
            assert list_page(store, None, True, 1, 0)[1] == FOLD_AT + 16 + 1  # the committed rows
            assert _unfolded(store) == 2  # everything folded but a's locked rows
            check(store)  # a's open writes are not counted
            a.commit()
            assert _unfolded(store) == 3  # a's paused, failed and new cancelled rows
            check(store)
            assert fold_state_counts(store) == 3  # now that a has committed
            assert _unfolded(store) == 0
            a.execute(update(S).where(S.c.id == select(func.min(S.c.id)).scalar_subquery()).values(state="failed"))
            a.commit()  # a writes again after its rows were folded: fresh rows
        assert _unfolded(store) == 2
        check(store)
        assert fold_state_counts(store) == 2
        assert _unfolded(store) == 0 and _count_rows(store) <= len(STATES)
        check(store)
    finally:
        store.close()


def test_pg_a_failed_fold_never_fails_list(pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    store = Store(pg_url)
    try:
        with store.engine.begin() as conn:  # shard-0 rows to hold
            conn.execute(insert(S), [row(s, i=i) for i, s in enumerate(STATES)])
        fold_state_counts(store)
        _spread(pg_url, FOLD_AT + 6)
        rows_before = _count_rows(store)
        assert rows_before > FOLD_AT
        with store.engine.connect() as holder:  # another fold, stuck: holds the shard-0 rows
            holder.execute(text("SELECT * FROM schedule_state_counts WHERE shard = 0 FOR UPDATE"))
            with caplog.at_level(logging.DEBUG, logger="promptyoself.store.queries"):
                total = list_page(store, None, True, 1, 0)[1]
            assert total == len(STATES) + FOLD_AT + 6
            assert "folding the schedule state counters failed" in caplog.text
            assert _count_rows(store) == rows_before  # the fold rolled back as a whole
            holder.rollback()
        check(store)  # this list folds
        assert _unfolded(store) == 0
    finally:
        store.close()


def test_pg_two_writers_never_wait_on_each_others_counter_rows(pg_url: str) -> None:
    store = Store(pg_url)
    try:
        with store.engine.begin() as conn:
            conn.execute(insert(S), [row(s, i=i) for i, s in enumerate(STATES * 4)])
        with store.engine.connect() as conn:
            ids = {s: [int(i) for i in conn.execute(
                text("SELECT id FROM schedules WHERE state = :s ORDER BY id"), {"s": s}).scalars()] for s in STATES}
        with store.engine.connect() as a, store.engine.connect() as b:
            a.begin()  # session A: writes to every state's count, and stays open
            a.execute(insert(S).values([row(s, i=100) for s in STATES]))
            a.execute(update(S).where(S.c.id == ids["active"][0]).values(state="cancelled"))
            a.execute(delete(S).where(S.c.id == ids["paused"][0]))
            b.begin()  # session B: the same states, in the other order, must not wait for A (still open):
            b.execute(text("SET LOCAL lock_timeout = '2s'"))  # waiting for A's lock would fail here
            b.execute(insert(S).values([row(s, i=200) for s in reversed(STATES)]))
            b.execute(update(S).where(S.c.id == ids["failed"][0]).values(state="active"))
            b.execute(delete(S).where(S.c.id == ids["completed"][0]))
            b.commit()
            a.commit()
        check(store)
    finally:
        store.close()


def test_fold_is_a_no_op_when_there_is_nothing_to_fold(pg_url: str) -> None:
    store = Store(pg_url)
    try:
        assert fold_state_counts(store) == 0
        with store.engine.begin() as conn:
            conn.execute(insert(S).values(row("active")))
        assert fold_state_counts(store) == 1
        assert fold_state_counts(store) == 0
        check(store)
    finally:
        store.close()
