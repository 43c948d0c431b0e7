"""The delivery loop in one process (issue 3, points 1, 4, 7 embedded, 8): sleeping until due, waking
on local writes, noticing other processes' writes, bounded concurrency, shutdown, and the tools."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from sqlalchemy import event

from promptyoself.delivery.attempt import Claim
from promptyoself.delivery.engine import Engine, run_in_thread
from promptyoself.delivery.recorder import deliver
from promptyoself.delivery.service import service_for
from promptyoself.faces.delivery import server_lifespan
from promptyoself.faces.mcp import build_server
from promptyoself.store.claims import claim_due
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import add_schedule, get, history, make_core, wait_until

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)


@pytest.fixture
def fake() -> Iterator[FakeLetta]:
    with FakeLetta(agents=4) as f:
        yield f


def now() -> datetime:
    return datetime.now(UTC)


class Running:
    """An executor loop in a background thread for the length of a test."""

    def __init__(self, core: Any, **kw: Any) -> None:
        self.ex = Engine(core, **kw)
        self.thread = run_in_thread(self.ex)

    def stop(self) -> None:
        self.ex.request_stop()
        assert self.ex.wait_stopped(5)
        self.ex.close()


@pytest.fixture
def running() -> Iterator[Any]:
    started: list[Running] = []

    def start(core: Any, **kw: Any) -> Engine:
        r = Running(core, **kw)
        started.append(r)
        return r.ex

    yield start
    for r in started:
        r.stop()


def count_statements(core: Any) -> list[str]:
    seen: list[str] = []
    event.listen(core.store.engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


def test_loop_sleeps_until_due_and_wakes_on_a_local_write(tmp_path: Path, fake: FakeLetta, running: Any) -> None:
    core = make_core(tmp_path / "w.db", fake)
    ex = running(core, interval=30.0)  # re-reads would come far too late: only the wake can do it
    wait_until(lambda: ex.last_tick is not None)
    made = asyncio.run(core.scheduling.schedule_time("wake up", "in 1s", agent_id=fake.agent_ids[0],
                                                     skip_validation=True))
    [row] = wait_until(lambda: history(core.store, made["id"]), timeout=10)
    assert row.outcome == "delivered" and row.attempted_at >= row.scheduled_for  # never early
    core.close()


def test_idle_loop_does_not_poll(tmp_path: Path, fake: FakeLetta, running: Any) -> None:
    core = make_core(tmp_path / "i.db", fake)
    add_schedule(core.store, fake.agent_ids[0], "far away", now() + timedelta(hours=5))
    statements = count_statements(core)
    ex = running(core, interval=30.0)
    wait_until(lambda: ex.next_due is not None)
    before = len(statements)
    time.sleep(1.5)
    assert len(statements) - before == 0  # asleep until the due time or the next re-read
    assert ex.next_due is not None and ex.next_due > now() + timedelta(hours=4)
    core.close()


def test_other_process_writes_are_seen_within_the_interval(tmp_path: Path, fake: FakeLetta, running: Any) -> None:
    core = make_core(tmp_path / "o.db", fake)
    statements = count_statements(core)
    running(core, interval=0.3)
    time.sleep(1.0)
    reads = len(statements)
    assert reads <= 1.0 / 0.3 + 3  # one cheap read per interval, no busy loop
    other = make_core(tmp_path / "o.db", fake)  # its own engine, as another process would have
    sid = add_schedule(other.store, fake.agent_ids[1], "from elsewhere", now() + timedelta(seconds=0.2))
    [row] = wait_until(lambda: history(core.store, sid), timeout=10)
    assert row.outcome == "delivered" and len(fake.received) == 1
    other.close()
    core.close()


def test_a_slow_send_to_one_agent_does_not_hold_up_another(tmp_path: Path, fake: FakeLetta, running: Any) -> None:
    core = make_core(tmp_path / "h.db", fake, letta_timeout=4.0)
    fake.timeout_sleep = 10.0
    fake.fail_next(1, "timeout")  # agent A's send hangs until our 4 s timeout
    slow = add_schedule(core.store, fake.agent_ids[0], "A hangs", now() - timedelta(seconds=1))
    add_schedule(core.store, fake.agent_ids[0], "A waits its turn", now() - timedelta(seconds=0.5))
    ex = running(core, interval=30.0)  # no re-read comes to the rescue: the alarm must be right
    wait_until(lambda: ex.info()["in_flight"] == 1)
    quick = add_schedule(core.store, fake.agent_ids[1], "B on time", now() + timedelta(seconds=0.3))
    ex.wake()  # as Core.on_change would after a write in this process
    wait_until(lambda: history(core.store, quick), timeout=10)
    assert history(core.store, slow) == []  # A's send was still hanging when B went out
    assert wait_until(lambda: history(core.store, slow), timeout=15)[0].outcome == "retry"
    core.close()


def test_one_message_per_agent_and_at_most_max_in_flight(tmp_path: Path, fake: FakeLetta, running: Any) -> None:
    fake.latency = 0.15
    core = make_core(tmp_path / "c.db", fake, max_in_flight=3)
    due = now() - timedelta(seconds=1)
    for agent in fake.agent_ids:
        for i in range(3):
            add_schedule(core.store, agent, f"{agent[-4:]}-{i}", due + timedelta(milliseconds=i))
    running(core)
    wait_until(lambda: len(fake.received) == 12, timeout=30)
    assert fake.max_concurrent_per_agent == 1
    assert 2 <= fake.max_concurrent <= 3
    for agent in fake.agent_ids:  # each agent's prompts arrive in due order
        texts = [m["text"].split("\n")[1] for m in fake.received if m["agent_id"] == agent]
        assert texts == [f"{agent[-4:]}-{i}" for i in range(3)]
    core.close()


def test_stop_lets_in_flight_sends_finish_and_releases_unsent_claims(tmp_path: Path, fake: FakeLetta) -> None:
    fake.latency = 0.5
    core = make_core(tmp_path / "s.db", fake)
    sid = add_schedule(core.store, fake.agent_ids[0], "in flight", now() - timedelta(seconds=1))
    ex = Engine(core)
    run_in_thread(ex)
    wait_until(lambda: ex.info()["in_flight"] == 1)
    ex.request_stop()
    assert ex.wait_stopped(30)  # stops by itself once the in-flight send is recorded
    assert get(core.store, sid).state == "completed" and get(core.store, sid).claimed_by is None
    # a claim not yet sent when the stop comes is given back, with no attempt recorded
    sid2 = add_schedule(core.store, fake.agent_ids[1], "not yet", now() - timedelta(seconds=1))
    t = now()
    [row] = claim_due(core.store, "stopping", t, t + timedelta(seconds=30), limit=5)
    stopping = threading.Event()
    stopping.set()
    res = deliver(core, Claim.from_row(row), "stopping", stopping=stopping)
    assert res.outcome == "released" and history(core.store, sid2) == []
    assert get(core.store, sid2).claimed_by is None
    ex.close()
    core.close()


# ---- through the MCP tools ------------------------------------------------------------------------


@pytest.fixture
async def mcp(tmp_path: Path, fake: FakeLetta) -> AsyncIterator[tuple[Client[Any], Any]]:
    core = make_core(tmp_path / "t.db", fake)
    async with Client(build_server(core)) as c:
        yield c, core
    svc = service_for(core)
    await asyncio.to_thread(svc.stop)
    core.close()


async def call(client: Client[Any], tool: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    result = await client.call_tool(tool, args or {})
    assert not result.is_error, result.content
    return dict(result.structured_content)


async def test_execute_once_returns_what_it_delivered(mcp: Any, fake: FakeLetta) -> None:
    client, core = mcp
    a = add_schedule(core.store, fake.agent_ids[0], "one", now() - timedelta(seconds=2))
    b = add_schedule(core.store, fake.agent_ids[1], "two", now() - timedelta(seconds=1), schedule_type="interval",
                     value="1h", max_repetitions=5)
    out = await call(client, "promptyoself_execute")
    assert out["status"] == "success" and "Delivered 2 of 2" in out["message"]
    items = {i["id"]: i for i in out["executed"]}
    assert set(items) == {a, b}
    for item in items.values():
        assert {"id", "agent_id", "delivered", "next_run", "repetition_count", "max_repetitions",
                "completed"} <= set(item)
        assert item["delivered"] and item["repetition_count"] == 1
    assert items[a]["completed"] and items[a]["next_run"] is None
    assert not items[b]["completed"] and items[b]["max_repetitions"] == 5 and items[b]["next_run"]
    again = await call(client, "promptyoself_execute", {"loop": False})
    assert again["executed"] == [] and again["message"] == "Nothing was due."
    hist = await call(client, "promptyoself_history", {"schedule_id": a})
    [row] = hist["deliveries"]
    assert row["outcome"] == "delivered" and row["attempt"] == 1 and row["letta_run_id"].startswith("run-")
    assert row["scheduled_for"] and row["attempted_at"] and row["lateness_s"] >= 1 and row["error"] is None


async def test_execute_loop_returns_at_once_and_never_blocks_the_server(mcp: Any, fake: FakeLetta) -> None:
    """Deterministic: the fake Letta holds every send until released, so the tools are asked while a
    delivery is certainly in flight (no latency race), and ``execute`` reports the state the loop
    really has (``running`` is true before the loop's thread gets to run)."""
    client, core = mcp
    fake.release.clear()  # every send waits in the fake until fake.release is set
    for i in range(4):
        add_schedule(core.store, fake.agent_ids[0], f"slow {i}", now() - timedelta(seconds=1))
    out = await call(client, "promptyoself_execute", {"loop": True, "interval": 0.5})
    assert out["running"] is True and out["interval"] == 0.5 and "Started" in out["message"]
    health = await call(client, "health")  # at once, before the loop's thread may have started
    assert health["executor"]["running"] is True
    for _ in range(400):  # the loop is now blocked in a send to Letta
        if fake.max_concurrent >= 1:
            break
        await asyncio.sleep(0.025)
    assert fake.max_concurrent >= 1
    health = await call(client, "health")  # answers while the loop is busy delivering
    assert health["status"] == "ok" and health["executor"]["running"] is True
    assert fake.received == []
    status = await call(client, "promptyoself_executor_status")
    assert status["status"] == "ok" and status["running"] is True and status["interval"] == 0.5
    assert set(status) >= {"running", "interval", "last_tick", "next_due", "due_now", "delivered_total",
                           "failed_total", "worker", "auth_error"}
    second = await call(client, "promptyoself_execute", {"loop": True})
    assert "already running" in second["message"] and second["running"] is True
    fake.release.set()
    made = await call(client, "promptyoself_schedule_time", {"prompt": "via tool", "time": "in 1s",
                                                             "agent_id": fake.agent_ids[2]})
    for _ in range(300):
        status = await call(client, "promptyoself_executor_status")
        if status["delivered_total"] == 5:
            break
        await asyncio.sleep(0.05)
    assert len(fake.received) == 5
    assert status["delivered_total"] == 5 and status["failed_total"] == 0 and status["due_now"] == 0
    assert status["last_tick"] and status["next_due"] is None
    hist = await call(client, "promptyoself_history", {"schedule_id": made["id"]})
    assert hist["deliveries"][0]["outcome"] == "delivered"


async def test_embedded_mode_delivers_from_inside_the_server(tmp_path: Path, fake: FakeLetta) -> None:
    core = make_core(tmp_path / "e.db", fake, executor_mode="embedded", executor_autostart=True)
    async with Client(build_server(core, lifespan=server_lifespan(core))) as client:
        status = await call(client, "promptyoself_executor_status")
        assert status["running"] and status["mode"] == "embedded" and status["executor"]["role"] == "embedded"
        await call(client, "promptyoself_schedule_time", {"prompt": "embedded", "time": "in 1s",
                                                          "agent_id": fake.agent_ids[0]})
        for _ in range(200):
            if fake.received:
                break
            await asyncio.sleep(0.05)
        assert fake.received_texts()[0].endswith("\nembedded")
    ex = core.delivery.executor
    assert ex is not None and not ex.running  # ended with the server
    core.close()


async def test_off_mode_runs_nothing(tmp_path: Path, fake: FakeLetta) -> None:
    core = make_core(tmp_path / "x.db", fake, executor_mode="off", executor_autostart=True)
    async with Client(build_server(core, lifespan=server_lifespan(core))) as client:
        status = await call(client, "promptyoself_executor_status")
        assert status["running"] is False and status["mode"] == "off" and status["executor"] is None
    core.close()
