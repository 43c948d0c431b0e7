"""Guardrails against a runaway agent (issue 22, point 4): the daily delivery budgets (per agent and
per schedule), the limit on schedules created per hour, the approval policy, and ``run_now``. A real
SQLite file, a settable clock and the fake Letta over HTTP."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from promptyoself.core.operations import Core
from promptyoself.delivery.metrics import registry_for, render
from promptyoself.errors import InvalidArgument, RateLimited
from promptyoself.faces.delivery import run_once_result
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import T0, Clock, add_schedule, history, make_core


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


def drain(core: Core) -> list[str]:
    """Run delivery until nothing is due; the outcomes in order."""
    outcomes: list[str] = []
    for _ in range(50):
        executed = run_once_result(core).get("executed") or []
        if not executed:
            return outcomes
        outcomes.extend(str(e.get("outcome")) for e in executed)
    raise AssertionError("delivery did not settle")


def test_schedules_per_hour_are_limited_with_a_code_the_agent_can_read(db_path: Path, clock: Clock) -> None:
    core = make_core(db_path, clock=clock, max_schedules_per_agent_per_hour=3)
    try:
        for i in range(3):
            asyncio.run(core.scheduling.schedule_time(f"p{i}", "in 1h", agent_id="agent-a", skip_validation=True))
            clock.advance(60)
        with pytest.raises(RateLimited) as err:
            asyncio.run(core.scheduling.schedule_time("one too many", "in 1h", agent_id="agent-a",
                                                      skip_validation=True))
        assert err.value.code == "rate_limited"
        assert "policy max_schedules_per_agent_per_hour=3" in err.value.message
        assert err.value.details["retry_after_s"] == 3600 - 180
        # another agent is not affected, and a retry with an idempotency key is not a new schedule
        asyncio.run(core.scheduling.schedule_time("other", "in 1h", agent_id="agent-b", skip_validation=True))
        clock.advance(3600 - 180 + 1)  # the first one left the hour
        made = asyncio.run(core.scheduling.schedule_time("now it fits", "in 1h", agent_id="agent-a",
                                                         skip_validation=True))
        assert made["state"] == "active"
        usage = asyncio.run(core.scheduling.list_schedules(agent_id="agent-a"))["guardrails"]["usage"]
        assert usage["created_last_hour"] == 3 and usage["hourly_limit"] == 3
    finally:
        core.close()


@pytest.mark.slow
def test_approval_policy_parks_frequent_rules_until_approved(db_path: Path, clock: Clock, fake: FakeLetta) -> None:
    core = make_core(db_path, fake, clock=clock, approval_below="1h")
    agent = fake.agent_ids[0]
    try:
        often = asyncio.run(core.scheduling.schedule_every("check the queue", "10m", agent_id=agent))
        assert often["state"] == "pending_approval" and "approval_below" in often["message"]
        cron = asyncio.run(core.scheduling.schedule_cron("tick", "*/5 * * * *", agent_id=agent))
        assert cron["state"] == "pending_approval"
        daily = asyncio.run(core.scheduling.schedule_cron("standup", "0 9 * * MON-FRI", agent_id=agent))
        once = asyncio.run(core.scheduling.schedule_time("once", "in 1m", agent_id=agent))
        slow = asyncio.run(core.scheduling.schedule_every("slow", "2h", agent_id=agent))
        assert daily["state"] == once["state"] == slow["state"] == "active"

        listed = {s["id"]: s["state"] for s in asyncio.run(core.scheduling.list_schedules(agent_id=agent))["schedules"]}
        assert listed[often["id"]] == "pending_approval", "list shows pending schedules by default"
        with pytest.raises(InvalidArgument):
            asyncio.run(core.scheduling.pause(often["id"]))  # no way around the approval
        with pytest.raises(InvalidArgument):
            asyncio.run(core.scheduling.resume(often["id"]))
        with pytest.raises(InvalidArgument):
            asyncio.run(core.operator.run_now(often["id"]))
        assert asyncio.run(core.health())["guardrails"]["pending_approval"] == 2

        clock.advance(minutes=11)  # past the pending schedule's first slot
        assert often["id"] not in {e["id"] for e in run_once_result(core).get("executed") or []}
        approved = asyncio.run(core.operator.approve(often["id"]))
        assert approved["state"] == "active" and approved["next_run"] is not None
        assert approved["next_run"] > (clock.now).isoformat().replace("+00:00", "Z")
        rejected = asyncio.run(core.operator.reject(cron["id"]))
        assert rejected["state"] == "cancelled"
        with pytest.raises(InvalidArgument):
            asyncio.run(core.operator.approve(cron["id"]))
        clock.advance(minutes=10)
        assert "delivered" in drain(core)
        assert any(d.schedule_id == often["id"] and d.outcome == "delivered" for d in history(core.store))
        assert all(d.schedule_id != cron["id"] for d in history(core.store))
    finally:
        core.close()


@pytest.mark.slow
def test_agent_daily_budget_holds_back_and_then_says_so(db_path: Path, clock: Clock, fake: FakeLetta) -> None:
    budget_day(str(db_path), clock, fake)


@pytest.mark.slow
@pytest.mark.postgres
def test_agent_daily_budget_on_postgres(pg_url: str, clock: Clock, fake: FakeLetta) -> None:
    budget_day(pg_url, clock, fake)


def budget_day(db: str, clock: Clock, fake: FakeLetta) -> None:
    core = make_core(db, fake, clock=clock, max_deliveries_per_agent_per_day=2)
    agent = fake.agent_ids[0]
    try:
        due = T0 - timedelta(minutes=5)
        ids = [add_schedule(core.store, agent, f"prompt {i}", due + timedelta(seconds=i)) for i in range(3)]
        assert sorted(drain(core)) == ["delivered", "delivered", "over_budget"]
        rows = {d.schedule_id: d for d in history(core.store)}
        over = rows[ids[2]]
        assert over.outcome == "over_budget" and "policy max_deliveries_per_agent_per_day=2" in (over.error or "")
        assert len(fake.received_texts()) == 2

        hist = asyncio.run(core.scheduling.history(agent_id=agent))
        assert hist["guardrails"]["usage"]["delivered_today"] == 2
        assert hist["guardrails"]["usage"]["budget_left"] == 0 and hist["guardrails"]["usage"]["held_back"] == 1
        today = asyncio.run(core.operator.today())
        assert today["over_budget"] == 1 and today["delivered"] == 2
        assert asyncio.run(core.health())["guardrails"]["over_budget_today"] == 1
        text = render(registry_for(core)).decode()
        assert 'promptyoself_deliveries_total{outcome="over_budget"} 1.0' in text
        assert 'promptyoself_guardrail_limit{guardrail="max_deliveries_per_agent_per_day"} 2.0' in text
        assert 'promptyoself_deliveries_today{outcome="over_budget"} 1.0' in text

        clock.set(T0 + timedelta(days=1))  # a new budget day
        add_schedule(core.store, agent, "the next day", clock.now - timedelta(seconds=1))
        assert drain(core) == ["delivered"]
        last = fake.received_texts()[-1]
        assert last.startswith("[PromptYoSelf] Your daily budget ran out: 1 scheduled prompt was not delivered")
        assert last.endswith("\nthe next day")
        assert asyncio.run(core.operator.agent_usage(agent))["held_back"] == 0, "announced once"
    finally:
        core.close()


@pytest.mark.slow
def test_schedule_max_per_day(db_path: Path, clock: Clock, fake: FakeLetta) -> None:
    core = make_core(db_path, fake, clock=clock)
    agent = fake.agent_ids[0]
    try:
        made = asyncio.run(core.scheduling.schedule_every("hourly-ish", "30m", agent_id=agent, max_per_day=1))
        assert asyncio.run(core.scheduling.list_schedules(agent_id=agent))["schedules"][0]["max_per_day"] == 1
        clock.advance(minutes=30)
        assert drain(core) == ["delivered"]
        clock.advance(minutes=30)
        assert drain(core) == ["over_budget"]
        err = history(core.store, made["id"])[-1].error or ""
        assert "max_per_day (1)" in err
        with pytest.raises(InvalidArgument):
            asyncio.run(core.scheduling.schedule_every("bad", "30m", agent_id=agent, max_per_day=0))
    finally:
        core.close()


@pytest.mark.slow
def test_run_now_delivers_the_next_occurrence_at_once(db_path: Path, clock: Clock, fake: FakeLetta) -> None:
    core = make_core(db_path, fake, clock=clock)
    agent = fake.agent_ids[0]
    try:
        made = asyncio.run(core.scheduling.schedule_every("every two hours", "2h", agent_id=agent))
        first: Any = made["next_run"]
        assert drain(core) == []
        result = asyncio.run(core.operator.run_now(made["id"]))
        assert result["state"] == "active"
        assert drain(core) == ["delivered"]
        row = asyncio.run(core.operator.console_schedule(made["id"]))
        assert row["schedule"]["next_run"] is not None and row["schedule"]["next_run"] > first
        assert row["deliveries"][0]["outcome"] == "delivered"
        assert len(row["upcoming"]) == 5 and row["rule"] == "Every 2h"
        asyncio.run(core.scheduling.pause(made["id"]))
        with pytest.raises(InvalidArgument, match="Resume it first"):
            asyncio.run(core.operator.run_now(made["id"]))
    finally:
        core.close()


def test_cli_approve_reject_and_max_per_day(db_path: Path, clock: Clock, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from promptyoself.faces import cli

    core = make_core(db_path, clock=clock, approval_below="1h")
    try:
        def run(*argv: str) -> tuple[int, dict[str, Any]]:
            code = cli.main(list(argv), core=core)
            return code, json.loads(capsys.readouterr().out)

        base = ("--agent-id", "agent-cli", "--skip-validation")
        code, made = run("schedule", "--prompt", "p", "--every", "5m", "--max-per-day", "3", *base)
        assert code == 0 and made["state"] == "pending_approval" and "delivery" not in made
        code, other = run("schedule", "--prompt", "q", "--cron", "*/10 * * * *", *base)
        assert other["state"] == "pending_approval"
        code, listed = run("list", "--agent-id", "agent-cli")
        assert {s["state"] for s in listed["schedules"]} == {"pending_approval"}
        assert listed["schedules"][0]["max_per_day"] == 3
        assert listed["guardrails"]["approval_below"] == "1h"
        code, approved = run("approve", str(made["id"]))
        assert code == 0 and approved["state"] == "active" and "delivery" in approved
        code, rejected = run("reject", str(other["id"]))
        assert code == 0 and rejected["state"] == "cancelled"
        code, again = run("reject", str(other["id"]))
        assert code == 1 and again["code"] == "invalid_argument"
        code, health = run("health")
        assert health["guardrails"]["pending_approval"] == 0
        assert health["guardrails"]["max_schedules_per_agent_per_hour"] == 60
        code, hist = run("history", "--agent-id", "agent-cli")
        assert hist["guardrails"]["usage"]["daily_budget"] == 500
    finally:
        core.close()


def test_approval_below_off_and_budgets_zero(monkeypatch: pytest.MonkeyPatch, db_path: Path) -> None:
    from promptyoself.config import load_settings

    monkeypatch.setenv("PROMPTYOSELF_APPROVAL_BELOW", "off")
    monkeypatch.setenv("PROMPTYOSELF_MAX_DELIVERIES_PER_AGENT_PER_DAY", "0")
    settings = load_settings()
    assert settings.approval_below is None and settings.max_deliveries_per_agent_per_day == 0
    core = make_core(db_path, approval_below=None, max_deliveries_per_agent_per_day=0)
    try:
        assert asyncio.run(core.scheduling.schedule_every("fast", "10s", agent_id="agent-z",
                                                          skip_validation=True))["state"] == "active"
        usage = asyncio.run(core.operator.agent_usage("agent-z"))
        assert usage["daily_budget"] is None and usage["budget_left"] is None
    finally:
        core.close()


def test_first_id_of_the_day_by_binary_search(db_path: Path) -> None:
    """``first_id_since`` finds the first row of a day over ids with gaps, as a full scan would."""
    import random

    from sqlalchemy import delete, insert

    from promptyoself.store.db import Delivery
    from promptyoself.store.operator import first_id_since, outcomes_since

    core = make_core(db_path)
    try:
        sid = add_schedule(core.store, "agent-b", "p", T0)
        rng = random.Random(7)
        at = T0 - timedelta(days=2)
        rows = []
        for i in range(1, 400):
            at += timedelta(minutes=rng.randrange(1, 30))
            rows.append({"id": i * 3 + rng.randrange(3), "schedule_id": sid, "agent_id": "agent-b",
                         "scheduled_for": at, "attempted_at": at, "attempt": 1,
                         "outcome": rng.choice(["delivered", "failed", "over_budget"])})
        with core.store.engine.begin() as conn:
            conn.execute(insert(Delivery), rows)
        for since in (T0 - timedelta(days=3), T0 - timedelta(days=1), rows[200]["attempted_at"], at,
                      at + timedelta(seconds=1)):
            want = min((r["id"] for r in rows if r["attempted_at"] >= since), default=None)
            assert first_id_since(core.store, since) == want, since
            counts: dict[str, int] = {}
            for r in rows:
                if r["attempted_at"] >= since:
                    counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
            assert outcomes_since(core.store, since) == counts
        with core.store.engine.begin() as conn:
            conn.execute(delete(Delivery))
        assert first_id_since(core.store, T0) is None and outcomes_since(core.store, T0) == {}
    finally:
        core.close()


@pytest.mark.slow
def test_terminal_shows_the_guardrails_in_one_line(db_path: Path, clock: Clock) -> None:
    from promptyoself.faces.tables import render

    core = make_core(db_path, clock=clock, approval_below="5m", max_schedules_per_agent_per_hour=9)
    try:
        asyncio.run(core.scheduling.schedule_every("p", "1h", agent_id="agent-t", skip_validation=True, max_per_day=2))
        text = render(dict(asyncio.run(core.scheduling.list_schedules(agent_id="agent-t"))))
        assert ("Guardrails: 0 of 500 delivered today; 1 of 9 schedules made in the last hour; "
                "approval below 5m.") in text
        assert "guardrails." not in text
        everyone = render(dict(asyncio.run(core.scheduling.history())))
        line = "Guardrails: 500 deliveries per agent a day; 9 schedules per agent an hour; approval below 5m."
        assert line in everyone
    finally:
        core.close()
