"""``list`` pages and totals (promptyoself/queries.py) agree with a plain filter over every row.

The fast paths (short page, counting by subtraction, per-agent index) must all give the exact answer,
whichever count strategy the previous call picked.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from promptyoself.config import Settings
from promptyoself.core.operations import Core
from promptyoself.store.db import Schedule, Store
from promptyoself.store.queries import LIVE_STATES, list_page

STATES = ("active", "paused", "completed", "cancelled", "failed")


def fill(store: Store, n: int, weights: tuple[int, ...], agents: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    now = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)
    rows = []
    for i in range(n):
        state = rng.choices(STATES, weights)[0]
        due = now + timedelta(minutes=i + 1)
        rows.append({
            "agent_id": f"agent-{rng.randrange(agents)}", "prompt_text": f"p{i}", "schedule_type": "once",
            "schedule_value": "x", "timezone": "UTC", "next_run": due,
            "due_at": due if state == "active" else None, "state": state, "created_at": now,
            "updated_at": now, "repetition_count": 0, "attempt": 0,
        })
    if rows:
        with store.engine.begin() as conn:
            conn.execute(insert(Schedule.__table__), rows)
    with store.engine.connect() as conn:
        from sqlalchemy import select

        return [dict(r._mapping) for r in conn.execute(select(Schedule.__table__).order_by(Schedule.id))]


def expected(rows: list[dict[str, Any]], agent: str | None, include_ended: bool, lim: int, off: int):
    keep = [r for r in rows if (agent is None or r["agent_id"] == agent)
            and (include_ended or r["state"] in LIVE_STATES)]
    return [r["id"] for r in keep[off:off + lim]], len(keep)


@pytest.mark.parametrize("weights", [(8, 1, 1, 1, 1), (1, 1, 6, 6, 6), (1, 0, 0, 0, 0), (0, 0, 1, 1, 1)])
def test_pages_and_totals_match_a_plain_filter(tmp_path: Path, weights: tuple[int, ...]) -> None:
    store = Store(f"sqlite:///{tmp_path / 'l.db'}")
    try:
        rows = fill(store, 300, weights, agents=4, seed=sum(weights))
        agents = [None, "agent-0", "agent-3", "agent-nobody"]
        cases = [(a, inc, lim, off) for a in agents for inc in (False, True)
                 for lim, off in ((50, 0), (1, 0), (7, 3), (500, 0), (50, 250), (50, 299), (10, 1000))]
        for _ in range(2):  # the second round runs with whichever count strategy the first one chose
            for agent, inc, lim, off in cases:
                got, total = list_page(store, agent, inc, lim, off)
                assert ([r.id for r in got], total) == expected(rows, agent, inc, lim, off), (agent, inc, lim, off)
    finally:
        store.close()


def test_empty_database(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'e.db'}")
    try:
        assert list_page(store, None, False, 50, 0) == ([], 0)
        assert list_page(store, None, False, 50, 10) == ([], 0)
        assert list_page(store, "a", True, 50, 10) == ([], 0)
    finally:
        store.close()


def test_list_tool_result_shape_is_unchanged(tmp_path: Path) -> None:
    core = Core(Settings(db=str(tmp_path / "c.db"), executor_autostart=False))
    try:
        made = asyncio.run(core.scheduling.schedule_cron("standup", "0 9 * * MON-FRI", agent_id="agent-x",
                                                         timezone="Europe/Berlin",
                                  skip_validation=True))
        asyncio.run(core.scheduling.schedule_time("later", "in 1h", agent_id="agent-x", skip_validation=True))
        asyncio.run(core.scheduling.cancel(made["id"]))
        out = asyncio.run(core.scheduling.list_schedules(agent_id="agent-x", limit=1))
        assert (out["count"], out["total"], out["agent_id"]) == (1, 1, "agent-x")
        everything = asyncio.run(core.scheduling.list_schedules(agent_id="agent-x", include_cancelled=True, limit=1))
        assert (everything["count"], everything["total"]) == (1, 2)
        rec = everything["schedules"][0]
        assert set(rec) == {"id", "agent_id", "prompt_text", "schedule_type", "schedule_value", "timezone",
                            "next_run", "active", "state", "created_at", "last_run", "max_repetitions",
                            "repetition_count", "last_error",
                            "catch_up", "upcoming", "description", "max_per_day",  # issue 21, issue 22
                            "overlap",  # issue 43
                            "target", "target_options"}  # issue 31
        assert rec["state"] == "cancelled" and rec["active"] is False and rec["timezone"] == "Europe/Berlin"
        assert rec["next_run"].endswith("+00:00") and rec["created_at"].endswith("+00:00")
        assert rec["upcoming"] == [] and rec["catch_up"] == "latest"  # ended: no next runs
        assert rec["description"] == "At 09:00, Monday through Friday (Europe/Berlin)"
    finally:
        core.close()


def actual_counts(store: Store) -> dict[str, int]:
    from sqlalchemy import text

    with store.engine.connect() as conn:
        real = dict(conn.execute(text("SELECT state, count(*) FROM schedules GROUP BY state")).all())
        kept = dict(conn.execute(text("SELECT state, n FROM schedule_state_counts WHERE n != 0")).all())
    assert kept == real
    return real


def test_sqlite_state_counters_stay_exact_through_every_kind_of_write(tmp_path: Path) -> None:
    from sqlalchemy import delete, text, update

    store = Store(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        fill(store, 200, (5, 1, 1, 1, 1), agents=3, seed=7)
        actual_counts(store)
        rng = random.Random(3)
        for _ in range(60):
            with store.engine.begin() as conn:
                ids = [r[0] for r in conn.execute(text("SELECT id FROM schedules ORDER BY random() LIMIT 5"))]
                kind = rng.choice(("one", "many", "same", "delete", "other column"))
                if kind == "one":
                    conn.execute(update(Schedule.__table__).where(Schedule.id == ids[0])
                                 .values(state=rng.choice(STATES)))
                elif kind == "many":
                    conn.execute(update(Schedule.__table__).where(Schedule.id.in_(ids))
                                 .values(state=rng.choice(STATES)))
                elif kind == "same":  # state set to what it already is
                    conn.execute(text("UPDATE schedules SET state = state WHERE id = :i"), {"i": ids[0]})
                elif kind == "delete":
                    conn.execute(delete(Schedule.__table__).where(Schedule.id == ids[0]))
                else:
                    conn.execute(update(Schedule.__table__).where(Schedule.id.in_(ids)).values(attempt=1))
            actual_counts(store)
        with pytest.raises(RuntimeError):  # a failed transaction leaves the counters as they were
            with store.engine.begin() as conn:
                conn.execute(update(Schedule.__table__).values(state="cancelled"))
                raise RuntimeError("rolled back")
        actual_counts(store)
        live = sum(n for s, n in actual_counts(store).items() if s in LIVE_STATES)
        assert list_page(store, None, False, 1, 0)[1] == live
    finally:
        store.close()


def test_core_writes_keep_the_counters_exact(tmp_path: Path) -> None:
    core = Core(Settings(db=str(tmp_path / "k.db"), executor_autostart=False))
    try:
        made = [asyncio.run(core.scheduling.schedule_time(f"p{i}", "in 1h", agent_id=f"agent-{i % 3}",
                                                          skip_validation=True))["id"]
                for i in range(9)]
        asyncio.run(core.scheduling.cancel(made[0]))
        asyncio.run(core.scheduling.pause(made[1]))
        asyncio.run(core.scheduling.resume(made[1]))
        asyncio.run(core.scheduling.pause(made[2]))
        assert actual_counts(core.store) == {"active": 7, "paused": 1, "cancelled": 1}
        assert asyncio.run(core.scheduling.list_schedules(limit=2))["total"] == 8
        assert asyncio.run(core.scheduling.list_schedules(limit=2, include_cancelled=True))["total"] == 9
    finally:
        core.close()


def test_migration_0003_counts_the_rows_already_there(tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import text

    from promptyoself.store import db as store_module
    from promptyoself.store.db import make_engine

    url = f"sqlite:///{tmp_path / 'm.db'}"
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(store_module.__file__).with_name("migrations")))
    cfg.set_main_option("sqlalchemy.url", url)
    engine = make_engine(url)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")
    store_rows = [("active", 4), ("completed", 2), ("paused", 1)]
    with engine.begin() as conn:
        for state, n in store_rows:
            for _ in range(n):
                conn.execute(text(
                    "INSERT INTO schedules (agent_id, prompt_text, schedule_type, schedule_value, timezone, "
                    "state, created_at, updated_at, repetition_count, attempt) VALUES "
                    "('a', 'p', 'once', 'x', 'UTC', :s, '2026-01-01 00:00:00.000000', "
                    "'2026-01-01 00:00:00.000000', 0, 0)"), {"s": state})
    engine.dispose()
    store = Store(url)  # opening migrates to head
    try:
        assert actual_counts(store) == dict(store_rows)
    finally:
        store.close()
