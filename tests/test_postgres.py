"""PostgreSQL end to end: migrations and every tool through the in-memory MCP client, with the core on PG.

Needs ``PROMPTYOSELF_TEST_PG_URL`` (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test); each
test module gets a fresh schema (tests/pg.py). Without a reachable server every test here is skipped
with the reason. Delivery on PostgreSQL (claims, several workers) is tested with the executor.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import select, text
from sqlalchemy.engine import make_url

from promptyoself.config import Settings
from promptyoself.core.operations import Core
from promptyoself.faces.mcp import build_server
from promptyoself.store.db import HEAD_REVISION, Delivery, Schedule, Store, current_revision
from tests.pg import pg_schema, require_pg, schema_of, with_schema

pytestmark = pytest.mark.postgres

AGENT = "agent-00000000-0000-4000-8000-000000000001"


def pg_settings(url: str, **overrides: Any) -> Settings:
    base: dict[str, Any] = {"db": url, "executor_autostart": False}
    base.update(overrides)
    return Settings(**base)


@pytest.fixture(scope="module")
def store_url() -> Iterator[str]:
    """One migrated schema for the tool tests of this module (each test uses its own agent ids)."""
    require_pg()
    with pg_schema() as url:
        Store(url).close()
        yield url


@pytest.fixture
def pg_core(store_url: str, fake_letta: Any) -> Iterator[Core]:
    core = Core(pg_settings(store_url, letta_base_url=fake_letta.url))
    yield core
    core.close()


@pytest.fixture
async def client(pg_core: Core) -> AsyncIterator[Client]:
    async with Client(build_server(pg_core)) as c:
        yield c


async def call(c: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await c.call_tool(tool, arguments)
    assert result.structured_content is not None, tool
    return result.structured_content


async def call_error(c: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    with pytest.raises(ToolError) as info:
        await c.call_tool(tool, arguments)
    return json.loads(str(info.value))


def unique_agent(fake_letta: Any) -> str:
    """A fresh agent on the fake Letta, so tests sharing the schema do not see each other's rows."""
    return str(fake_letta.add_agent())


# ---- migrations ---------------------------------------------------------------------------------


def test_migrations_create_the_schema_in_a_fresh_pg_schema(pg_url: str) -> None:
    store = Store(pg_url)
    try:
        assert store.dialect == "postgresql"
        assert current_revision(store.engine) == HEAD_REVISION
        schema = schema_of(pg_url)
        insp = sa_inspect(store.engine)
        assert set(insp.get_table_names(schema=schema)) >= {
            "schedules", "deliveries", "worker_leases", "alembic_version"
        }
        indexes = {ix["name"]: ix for ix in insp.get_indexes("schedules", schema=schema)}
        wanted = {"ix_schedules_state_due", "ix_schedules_agent", "ix_schedules_state_id", "ux_schedules_idempotency"}
        assert wanted <= set(indexes)
        assert indexes["ux_schedules_idempotency"]["unique"]
        with store.engine.connect() as conn:
            kinds = dict(conn.execute(text(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = :s AND table_name = 'schedules'"
            ), {"s": schema}).all())
        assert kinds["next_run"] == "timestamp with time zone"
        assert kinds["due_at"] == "timestamp with time zone"
    finally:
        store.close()
    # Opening again at HEAD does nothing (and does not need Alembic).
    again = Store(pg_url)
    again.close()


def test_concurrent_first_opens_migrate_once(pg_url: str) -> None:
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_store() -> None:
        barrier.wait()
        try:
            Store(pg_url).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    store = Store(pg_url)
    try:
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar_one() == 1
    finally:
        store.close()


def test_delivery_and_list_statements_stay_prepared_with_one_generic_plan(store_url: str) -> None:
    """psycopg prepares a statement on its fifth run and forgets them all on ROLLBACK: the store's
    reads commit, so the claim, record and list statements are parsed and planned once per connection
    (store/db.py make_engine)."""
    from promptyoself.store.claims import claim_due, next_due
    from promptyoself.store.queries import list_page

    if make_url(store_url).get_driver_name() != "psycopg":
        pytest.skip("only psycopg 3 prepares statements (this URL names another driver)")
    store = Store(store_url)
    now = datetime.now(UTC)
    try:
        for _ in range(8):  # one thread: the pool hands out the same connection every time
            next_due(store, now, ["agent-a", "agent-b"])
            claim_due(store, "owner-prepared", now, now + timedelta(seconds=30), limit=4,
                      exclude_agents=["agent-a"])
            list_page(store, None, False, 50, 0)
        with store.engine.begin() as conn:
            prepared = list(conn.execute(text("SELECT statement FROM pg_prepared_statements")).scalars())
            mode = conn.execute(text("SHOW plan_cache_mode")).scalar()
        assert mode == "force_generic_plan"
        assert any("ORDER BY schedules.due_at" in q and "LIMIT" in q for q in prepared), prepared  # next_due
        assert any("NOT (EXISTS" in q for q in prepared), prepared  # the claim candidates
        assert any("FROM schedules" in q and "ORDER BY schedules.id" in q for q in prepared), prepared  # list
    finally:
        store.close()


def test_timestamps_come_back_aware_utc_whatever_the_session_timezone(store_url: str) -> None:
    url = make_url(store_url)
    options = f"{url.query['options']} -ctimezone=America/New_York"
    ny_url = url.update_query_dict({"options": options}).render_as_string(hide_password=False)
    store = Store(ny_url)
    when = datetime(2026, 3, 8, 7, 30, 15, 123456, tzinfo=timezone(timedelta(hours=-5)))
    now = datetime.now(UTC)
    try:
        with store.session() as s:
            row = Schedule(
                agent_id="agent-tz-roundtrip", prompt_text="p", schedule_type="once",
                schedule_value="x", timezone="UTC", next_run=when, due_at=when, state="cancelled",
                created_at=now, updated_at=now, repetition_count=0, attempt=0,
            )
            s.add(row)
        with store.session() as s:
            got = s.execute(select(Schedule).where(Schedule.id == row.id)).scalar_one()
            assert got.next_run == when
            assert got.next_run is not None and got.next_run.utcoffset() == timedelta(0)
            assert got.next_run.isoformat() == "2026-03-08T12:30:15.123456+00:00"
            with pytest.raises(Exception, match="naive"):
                got.due_at = datetime(2026, 1, 1)  # noqa: DTZ001
                s.flush()
    finally:
        store.close()


def test_with_schema_keeps_other_options() -> None:
    url = "postgresql+psycopg://u@h/db?options=-c%20statement_timeout%3D5000"
    out = with_schema(url, "pys_t_1_abcdef0123")
    opts = make_url(out).query["options"]
    assert "statement_timeout=5000" in opts and "-csearch_path=pys_t_1_abcdef0123" in opts
    assert schema_of(out) == "pys_t_1_abcdef0123"


# ---- tools --------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_schedule_tools_list_paging_and_state_changes(client: Client, fake_letta: Any) -> None:
    agent = unique_agent(fake_letta)
    t = await call(client, "promptyoself_schedule_time", prompt="once", time="in 5m", agent_id=agent)
    assert t["status"] == "success" and t["next_run"].endswith(("Z", "+00:00"))
    c = await call(client, "promptyoself_schedule_cron", prompt="cron", cron="0 9 * * MON-FRI",
                   agent_id=agent, timezone="Europe/Berlin")
    assert c["description"] and c["timezone"] == "Europe/Berlin"
    e = await call(client, "promptyoself_schedule_every", prompt="every", every="30m",
                   max_repetitions=3, agent_id=agent, skip_validation=True)
    ids = [t["id"], c["id"], e["id"]]
    assert ids == sorted(ids) and len(set(ids)) == 3
    for i in range(4):
        await call(client, "promptyoself_schedule_time", prompt=f"p{i}", time="in 1h", agent_id=agent)

    page1 = await call(client, "promptyoself_list", agent_id=agent, limit=3)
    page3 = await call(client, "promptyoself_list", agent_id=agent, limit=3, offset=6)
    assert (page1["count"], page1["total"]) == (3, 7)
    assert [s["id"] for s in page1["schedules"]] == ids
    assert (page3["count"], page3["total"]) == (1, 7)
    rec = page1["schedules"][1]
    assert rec["schedule_type"] == "cron" and rec["state"] == "active" and rec["active"] is True
    assert rec["created_at"].endswith(("Z", "+00:00")) and rec["next_run"].endswith(("Z", "+00:00"))

    paused = await call(client, "promptyoself_pause", schedule_id=c["id"])
    assert paused["state"] == "paused"
    resumed = await call(client, "promptyoself_resume", schedule_id=str(c["id"]))
    assert resumed["state"] == "active" and resumed["next_run"]
    cancelled = await call(client, "promptyoself_cancel", schedule_id=t["id"])
    assert cancelled["already_cancelled"] is False
    again = await call(client, "promptyoself_cancel", schedule_id=t["id"])
    assert again["already_cancelled"] is True
    live = await call(client, "promptyoself_list", agent_id=agent)
    everything = await call(client, "promptyoself_list", agent_id=agent, include_cancelled=True)
    assert (live["total"], everything["total"]) == (6, 7)

    err = await call_error(client, "promptyoself_pause", schedule_id=t["id"])
    assert err["code"] == "invalid_argument"
    err = await call_error(client, "promptyoself_cancel", schedule_id=987654321)
    assert err["code"] == "not_found"
    err = await call_error(client, "promptyoself_schedule_time", prompt="x", time="in 5m",
                           agent_id="agent-00000000-0000-4000-8000-00000000dead")
    assert err["code"] == "agent_not_found"


@pytest.mark.slow
async def test_history_on_pg(client: Client, pg_core: Core, fake_letta: Any) -> None:
    agent = unique_agent(fake_letta)
    made = await call(client, "promptyoself_schedule_time", prompt="h", time="in 5m", agent_id=agent)
    assert (await call(client, "promptyoself_history", schedule_id=made["id"]))["count"] == 0
    slot = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)
    with pg_core.store.session() as s:
        for n, outcome in enumerate(("retry", "delivered"), start=1):
            s.add(Delivery(schedule_id=made["id"], agent_id=agent, scheduled_for=slot,
                           attempted_at=slot + timedelta(seconds=n), outcome=outcome, attempt=n,
                           letta_run_id=f"run-{n}" if outcome == "delivered" else None,
                           error="HTTP 503" if outcome == "retry" else None, lateness_s=float(n)))
    hist = await call(client, "promptyoself_history", schedule_id=made["id"])
    assert [d["outcome"] for d in hist["deliveries"]] == ["delivered", "retry"]
    first = hist["deliveries"][0]
    assert first["scheduled_for"] in ("2026-06-15T12:00:00Z", "2026-06-15T12:00:00+00:00")
    assert first["letta_run_id"] == "run-2" and first["lateness_s"] == 2.0
    by_agent = await call(client, "promptyoself_history", agent_id=agent, limit=1)
    assert by_agent["count"] == 1
    err = await call_error(client, "promptyoself_history", schedule_id=987654321)
    assert err["code"] == "not_found"


@pytest.mark.slow
async def test_idempotency_key_dedups_on_pg(client: Client, fake_letta: Any) -> None:
    agent = unique_agent(fake_letta)
    args = {"prompt": "standup", "cron": "0 9 * * *", "agent_id": agent, "idempotency_key": "k-1"}
    first = await call(client, "promptyoself_schedule_cron", **args)
    second = await call(client, "promptyoself_schedule_cron", **args)
    assert first["deduplicated"] is False and second["deduplicated"] is True
    assert second["id"] == first["id"] and second["description"] == first["description"]
    other = await call(client, "promptyoself_schedule_cron", **{**args, "idempotency_key": "k-2"})
    assert other["id"] != first["id"]
    # NULL keys never collide: the unique index is on (agent_id, idempotency_key).
    a = await call(client, "promptyoself_schedule_time", prompt="a", time="in 5m", agent_id=agent)
    b = await call(client, "promptyoself_schedule_time", prompt="a", time="in 5m", agent_id=agent)
    assert a["id"] != b["id"]
    listed = await call(client, "promptyoself_list", agent_id=agent)
    assert listed["total"] == 4


@pytest.mark.slow
def test_concurrent_idempotent_calls_from_threads_make_one_row(pg_core: Core, fake_letta: Any) -> None:
    agent = unique_agent(fake_letta)
    n = 8
    barrier = threading.Barrier(n)

    def schedule(_: int) -> dict[str, Any]:
        barrier.wait()
        return asyncio.run(pg_core.scheduling.schedule_time("once only", "in 10m", agent_id=agent, skip_validation=True,
                                     idempotency_key="retry-me"))

    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(schedule, range(n)))
    assert len({r["id"] for r in results}) == 1
    assert sum(not r["deduplicated"] for r in results) == 1
    with pg_core.store.session() as s:
        rows = s.execute(select(Schedule).where(Schedule.agent_id == agent)).scalars().all()
    assert len(rows) == 1 and rows[0].idempotency_key == "retry-me"


@pytest.mark.slow
async def test_concurrent_idempotent_tool_calls_make_one_row(client: Client, fake_letta: Any) -> None:
    import asyncio

    agent = unique_agent(fake_letta)
    calls = [
        call(client, "promptyoself_schedule_every", prompt="x", every="1h", agent_id=agent,
             skip_validation=True, idempotency_key="same")
        for _ in range(6)
    ]
    results = await asyncio.gather(*calls)
    assert len({r["id"] for r in results}) == 1
    assert (await call(client, "promptyoself_list", agent_id=agent))["total"] == 1


@pytest.mark.slow
async def test_quota_counts_live_schedules_on_pg(store_url: str, fake_letta: Any) -> None:
    core = Core(pg_settings(store_url, letta_base_url=fake_letta.url, max_active_per_agent=2))
    try:
        async with Client(build_server(core)) as c:
            agent = unique_agent(fake_letta)
            one = await call(c, "promptyoself_schedule_time", prompt="1", time="in 5m", agent_id=agent)
            await call(c, "promptyoself_schedule_time", prompt="2", time="in 5m", agent_id=agent)
            err = await call_error(c, "promptyoself_schedule_time", prompt="3", time="in 5m", agent_id=agent)
            assert err["code"] == "quota_exceeded"
            await call(c, "promptyoself_cancel", schedule_id=one["id"])
            await call(c, "promptyoself_schedule_time", prompt="3", time="in 5m", agent_id=agent)
    finally:
        core.close()


@pytest.mark.slow
async def test_letta_and_agent_tools_with_pg_core(client: Client, fake_letta: Any) -> None:
    assert (await call(client, "promptyoself_test"))["status"] == "success"
    agents = await call(client, "promptyoself_agents")
    assert agents["count"] == len(fake_letta.agent_ids)
    up = await call(client, "promptyoself_upload", source_code="def ping(x: int) -> int:\n    '''P.'''\n    return x\n")
    assert up["name"] == "ping"
    agent = unique_agent(fake_letta)
    await call(client, "promptyoself_set_default_agent", agent_id=agent)
    diag = await call(client, "promptyoself_inference_diagnostics")
    assert diag["inferred_agent_id"] == agent
    made = await call(client, "promptyoself_schedule_time", prompt="inferred", time="in 5m")
    assert made["agent_id"] == agent
    assert (await call(client, "promptyoself_list"))["agent_id"] == agent
    await call(client, "promptyoself_set_scoped_default_agent", agent_id=agent)
    assert (await call(client, "promptyoself_get_scoped_default_agent"))["agent_id"] == agent


@pytest.mark.slow
async def test_health_on_pg_shows_the_url_without_password(pg_core: Core, fake_letta: Any) -> None:
    async with Client(build_server(pg_core)) as c:
        health = await call(c, "health")
    # the database is fine; schedules other tests left active make it `no_delivery` (nothing delivers here)
    assert health["status"] != "down" and {r["code"] for r in health["reasons"]} <= {"no_delivery"}, health
    assert health["db"].startswith("postgresql+psycopg://")
    assert isinstance(health["schedules_active"], int)
    password = make_url(pg_core.settings.db_url).password
    if password:
        assert str(password) not in json.dumps(health)


def test_health_masks_a_password_in_the_pg_url(store_url: str) -> None:
    url = make_url(store_url)
    if url.password:
        secret_url, secret = store_url, str(url.password)
    else:  # add one; a trust-auth server ignores it
        secret = "s3cret-Pa55"
        secret_url = url.set(password=secret).render_as_string(hide_password=False)
    core = Core(pg_settings(secret_url))
    try:
        try:
            health = asyncio.run(core.health())
        except Exception as exc:  # the server wants a real password: the masking is still tested
            pytest.skip(f"server refused the added password ({type(exc).__name__}); masking untestable")
        assert secret not in json.dumps(health)
        assert "***" in health["db"]
    finally:
        core.close()


@pytest.mark.slow
async def test_execute_and_executor_status_on_pg(client: Client, pg_core: Core, fake_letta: Any) -> None:
    """The delivery tools on PG (claims use FOR UPDATE SKIP LOCKED there); the multi-process delivery
    tests on PostgreSQL live with the delivery tests."""
    agent = unique_agent(fake_letta)
    due = datetime.now(UTC) - timedelta(seconds=5)
    with pg_core.store.session() as s:
        row = Schedule(agent_id=agent, prompt_text="due on pg", schedule_type="once", schedule_value="x",
                       timezone="UTC", next_run=due, due_at=due, state="active", created_at=due,
                       updated_at=due, repetition_count=0, attempt=0)
        s.add(row)
    ran = await call(client, "promptyoself_execute")
    mine = [e for e in ran["executed"] if e["id"] == row.id]
    assert mine and mine[0]["delivered"] is True and mine[0]["completed"] is True
    assert any(m["text"].endswith("\ndue on pg") for m in fake_letta.received)
    hist = await call(client, "promptyoself_history", schedule_id=row.id)
    assert hist["deliveries"][0]["outcome"] == "delivered" and hist["deliveries"][0]["letta_run_id"]
    status = await call(client, "promptyoself_executor_status")
    assert status["status"] == "ok" and status["delivered_total"] >= 1
    listed = await call(client, "promptyoself_list", agent_id=agent, include_cancelled=True)
    assert listed["schedules"][0]["state"] == "completed"


def test_batched_writes_bind_shared_values_once_and_keep_every_row(store_url: str) -> None:
    """store.claims on PostgreSQL: a column with one value for the whole batch is bound once, the
    others as arrays; every row is still written (even rows alike in all but their schedule)."""
    from promptyoself.store.claims import add_deliveries, write_schedules

    store = Store(store_url)
    now = datetime.now(UTC).replace(microsecond=0)
    try:
        with store.session() as s:
            rows = [Schedule(agent_id="agent-batched", prompt_text=f"p{i}", schedule_type="once", schedule_value="x",
                             timezone="UTC", next_run=now, due_at=now, state="active", created_at=now,
                             updated_at=now, repetition_count=0, attempt=0) for i in range(3)]
            s.add_all(rows)
        ids = [r.id for r in rows]
        with store.engine.begin() as conn:
            add_deliveries(conn, [{"schedule_id": ids[0], "agent_id": "agent-batched", "scheduled_for": now,
                                   "attempted_at": now, "outcome": "retry", "attempt": 1, "letta_run_id": None,
                                   "error": "boom", "lateness_s": 0.0}] * 2
                           + [{"schedule_id": ids[1], "agent_id": "agent-batched", "scheduled_for": now,
                               "attempted_at": now, "outcome": "retry", "attempt": 1, "letta_run_id": None,
                               "error": "boom", "lateness_s": 0.0}])
            write_schedules(conn, [(ids[0], {"state": "completed", "due_at": None, "repetition_count": 1}),
                                   (ids[1], {"state": "completed", "due_at": None, "repetition_count": 2}),
                                   (ids[2], {"state": "paused", "due_at": None, "repetition_count": 2})])
        with store.engine.begin() as conn:
            history = conn.execute(select(Delivery.schedule_id, Delivery.error)
                                   .where(Delivery.schedule_id.in_(ids)).order_by(Delivery.id)).all()
            states = conn.execute(select(Schedule.id, Schedule.state, Schedule.due_at, Schedule.repetition_count)
                                  .where(Schedule.id.in_(ids)).order_by(Schedule.id)).all()
        assert [tuple(h) for h in history] == [(ids[0], "boom"), (ids[0], "boom"), (ids[1], "boom")]
        assert [tuple(r) for r in states] == [(ids[0], "completed", None, 1), (ids[1], "completed", None, 2),
                                              (ids[2], "paused", None, 2)]
    finally:
        store.close()
