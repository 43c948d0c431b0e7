"""Health tells the truth: status ok|degraded|down with reasons {code, message, fix} (issue 10, point 4)."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from promptyoself.core.operations import Core
from promptyoself.faces import cli
from promptyoself.processes import hostname
from promptyoself.store.db import WorkerLease
from testkit.fake_letta import FakeLetta
from tests.conftest import FIXED_NOW, make_settings
from tests.helpers_delivery import add_schedule

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)


def codes(h: dict[str, Any]) -> list[str]:
    return [r["code"] for r in h["reasons"]]


@pytest.fixture
def fake() -> Any:
    with FakeLetta(agents=1) as f:
        yield f


def make_core(db_path: Path, url: str, **kw: Any) -> Core:
    return Core(make_settings(db_path, letta_base_url=url, **kw), clock=lambda: FIXED_NOW)


def hold_lease(core: Core, pid: int, until_s: float = 60) -> None:
    with core.store.session() as s:
        s.merge(WorkerLease(name="worker", owner="test", pid=pid, host=hostname(), started_at=FIXED_NOW,
                            heartbeat_at=FIXED_NOW, lease_until=FIXED_NOW + timedelta(seconds=until_s)))


def test_ok_when_nothing_is_due_and_letta_answers(db_path: Path, fake: FakeLetta) -> None:
    core = make_core(db_path, fake.url)
    h = asyncio.run(core.health())
    assert h["status"] == "ok" and h["reasons"] == [] and h["due_now"] == 0 and h["oldest_overdue_s"] is None
    core.close()


def test_due_without_delivery_is_degraded_and_names_the_fix(db_path: Path, fake: FakeLetta) -> None:
    core = make_core(db_path, fake.url)
    # due 3 s ago: within a live loop's budget (more would be delivery_behind, issue 42)
    add_schedule(core.store, fake.agent_ids[0], "due", FIXED_NOW - timedelta(seconds=3))
    h = asyncio.run(core.health())
    assert h["status"] == "degraded" and codes(h) == ["no_delivery"]
    assert h["due_now"] == 1 and h["oldest_overdue_s"] == 3.0 and h["delivery_live"] is False
    assert "promptyoself worker" in h["reasons"][0]["fix"] and "service install" in h["reasons"][0]["fix"]
    # A live worker lease (this test's own pid stands in for the worker) answers it.
    hold_lease(core, os.getpid())
    h = asyncio.run(core.health())
    assert h["status"] == "ok" and h["delivery_live"] is True
    # A lease whose process is gone is not live.
    hold_lease(core, 2**22 + 12345)
    assert codes(asyncio.run(core.health())) == ["no_delivery"]
    core.close()


def test_late_beyond_the_threshold(db_path: Path, fake: FakeLetta) -> None:
    core = make_core(db_path, fake.url, health_max_lateness="2m")
    add_schedule(core.store, fake.agent_ids[0], "late", FIXED_NOW - timedelta(minutes=3))
    hold_lease(core, os.getpid())
    h = asyncio.run(core.health())
    # unclaimed with its agent free under a live lease: it also waits for a send slot (issue 42)
    assert codes(h) == ["delivery_late", "delivery_behind"] and h["status"] == "degraded"
    assert "180s late" in h["reasons"][0]["message"] and "worker --status" in h["reasons"][0]["fix"]
    core.close()


def test_letta_unreachable_and_the_probe_is_cached(db_path: Path, fake: FakeLetta) -> None:
    core = make_core(db_path, fake.url)
    assert asyncio.run(core.health())["status"] == "ok"
    before = len(fake.requests)
    for _ in range(5):
        asyncio.run(core.health())
    assert len(fake.requests) == before, "health probed Letta on every call"
    fake.stop()
    core.settings.health_letta_cache = 0.0  # the cached answer expired
    h = asyncio.run(core.health())
    assert codes(h) == ["letta_unreachable"] and "promptyoself test" in h["reasons"][0]["fix"]
    core.close()


def test_letta_refusing_the_credentials(db_path: Path) -> None:
    with FakeLetta(agents=1, password="right") as fake:
        core = make_core(db_path, fake.url, letta_api_key="wrong")
        h = asyncio.run(core.health())
        assert codes(h) == ["letta_auth"] and "LETTA_API_KEY" in h["reasons"][0]["fix"]
        core.close()


def test_database_unreachable_is_down(tmp_path: Path, fake: FakeLetta) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    core = make_core(blocker / "promptyoself.db", fake.url)
    h = asyncio.run(core.health())
    assert h["status"] == "down" and codes(h) == ["database_unavailable"]
    assert "PROMPTYOSELF_DB" in h["reasons"][0]["fix"] and h["schedules_active"] is None
    core.close()


def test_cli_exit_code_follows_the_verdict(db_path: Path, fake: FakeLetta, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    core = make_core(db_path, fake.url)
    assert cli.main(["health", "--json"], core=core) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "ok"
    add_schedule(core.store, fake.agent_ids[0], "due", FIXED_NOW - timedelta(seconds=10))
    assert cli.main(["health", "--json"], core=core) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "degraded" and codes(out) == ["no_delivery"]
    core.close()


@pytest.mark.postgres
def test_postgres_unreachable_is_down(tmp_path: Path, fake: FakeLetta) -> None:
    core = Core(make_settings(tmp_path / "x.db", db="postgresql+psycopg://nobody@127.0.0.1:1/none",
                              letta_base_url=fake.url))
    h = asyncio.run(core.health())
    assert h["status"] == "down" and codes(h) == ["database_unavailable"]
    core.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_verdict_and_metrics_on_both_backends(backend: str, db_path: Path, fake: FakeLetta,
                                              request: pytest.FixtureRequest) -> None:
    from promptyoself.delivery.metrics import registry_for, render
    from promptyoself.store.db import Delivery

    db = request.getfixturevalue("pg_url") if backend == "postgres" else str(db_path)
    core = Core(make_settings(db_path, db=db, letta_base_url=fake.url), clock=lambda: FIXED_NOW)
    sid = add_schedule(core.store, fake.agent_ids[0], "due", FIXED_NOW - timedelta(seconds=30))
    with core.store.session() as s:
        for lateness, outcome, error in ((0.3, "delivered", None), (12.0, "delivered", None),
                                         (None, "retry", "letta_unavailable: down"),
                                         (None, "retry", "letta_auth: Letta refused the credentials")):
            s.add(Delivery(schedule_id=sid, agent_id=fake.agent_ids[0], scheduled_for=FIXED_NOW,
                           attempted_at=FIXED_NOW, outcome=outcome, attempt=1, lateness_s=lateness, error=error))
    h = asyncio.run(core.health())
    assert h["status"] == "degraded" and codes(h) == ["no_delivery"] and h["oldest_overdue_s"] == 30.0
    text = render(registry_for(core)).decode()
    assert 'promptyoself_deliveries_total{outcome="delivered"} 2.0' in text
    assert 'promptyoself_deliveries_total{outcome="retry"} 2.0' in text
    assert 'promptyoself_delivery_lateness_seconds_bucket{le="0.5"} 1.0' in text
    assert 'promptyoself_delivery_lateness_seconds_bucket{le="30.0"} 2.0' in text
    assert "promptyoself_delivery_lateness_seconds_sum 12.3" in text
    assert "promptyoself_due_backlog 1.0" in text and "promptyoself_oldest_overdue_seconds 30.0" in text
    assert 'promptyoself_letta_errors_total{kind="letta_unavailable"} 1.0' in text
    assert 'promptyoself_letta_errors_total{kind="letta_auth"} 1.0' in text
    assert "promptyoself_worker_up 0.0" in text and "promptyoself_database_up 1.0" in text
    core.close()


def test_prompts_waiting_for_a_send_slot_are_behind(db_path: Path, fake: FakeLetta) -> None:
    """Issue 42: with 8 Claude Code turns hanging, 13 prompts were due (the oldest 47.7 s) and health
    said ok. A due prompt whose agent is free waits only for a send slot: past BEHIND_FACTOR loop
    intervals (at least 1 s each) that is ``delivery_behind``. A prompt waiting for its own agent's
    previous prompt (claimed, in flight) is not counted."""
    from promptyoself.core.health import BEHIND_FACTOR
    from promptyoself.store.claims import claim_due

    core = make_core(db_path, fake.url, executor_interval=1.0)
    hold_lease(core, os.getpid())
    busy = "agent-in-a-long-turn"
    add_schedule(core.store, busy, "being sent", FIXED_NOW - timedelta(seconds=60))
    add_schedule(core.store, busy, "after it", FIXED_NOW - timedelta(seconds=59))
    assert len(claim_due(core.store, "worker:x", FIXED_NOW, FIXED_NOW + timedelta(seconds=60), limit=1)) == 1
    add_schedule(core.store, "agent-free-soon", "just due", FIXED_NOW - timedelta(seconds=BEHIND_FACTOR - 1))
    h = asyncio.run(core.health())
    assert h["status"] == "ok", h["reasons"]  # one waits for its agent; the other is within the budget
    add_schedule(core.store, "agent-free", "waits for a slot", FIXED_NOW - timedelta(seconds=BEHIND_FACTOR + 20))
    h = asyncio.run(core.health())
    assert h["status"] == "degraded" and codes(h) == ["delivery_behind"]
    [reason] = h["reasons"]
    assert reason["message"].startswith("2 due prompt(s) whose agents are free wait for a send slot")
    assert "(letta) has waited 25.0s" in reason["message"]
    assert "PROMPTYOSELF_MAX_IN_FLIGHT" in reason["fix"] and "worker --status" in reason["fix"]
    core.close()


def test_prompts_queued_behind_their_agent_past_a_minute_are_degraded(db_path: Path, fake: FakeLetta) -> None:
    """Issue 42 finding 15: 50 every-minute schedules per agent, 9,469 due and the oldest 98 s overdue,
    and health said ok (every agent had a prompt in flight, so none waited for a send slot). A due
    prompt waiting behind its own agent's previous prompt for more than ``QUEUED_S`` is
    ``delivery_queued``."""
    from promptyoself.core.health import QUEUED_S
    from promptyoself.store.claims import claim_due

    core = make_core(db_path, fake.url, executor_interval=1.0)
    hold_lease(core, os.getpid())
    agent = "agent-with-fifty"
    add_schedule(core.store, agent, "being sent", FIXED_NOW - timedelta(seconds=QUEUED_S + 40))
    for i in range(3):
        add_schedule(core.store, agent, f"queued {i}", FIXED_NOW - timedelta(seconds=QUEUED_S - 1 - i))
    assert len(claim_due(core.store, "worker:x", FIXED_NOW, FIXED_NOW + timedelta(seconds=60), limit=5)) == 1
    h = asyncio.run(core.health())
    assert h["status"] == "ok", h["reasons"]  # queued, but less than a minute
    add_schedule(core.store, agent, "queued long", FIXED_NOW - timedelta(seconds=QUEUED_S + 38))
    h = asyncio.run(core.health())
    assert h["status"] == "degraded" and codes(h) == ["delivery_queued"], h["reasons"]
    [reason] = h["reasons"]
    assert reason["message"].startswith("4 due prompt(s) wait behind their agent's previous prompt")
    assert "(letta) has waited 98.0s" in reason["message"]
    core.close()
