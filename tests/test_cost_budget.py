"""Cost budgets (issue 43 point 2): per agent per day, tokens and USD over what the agent's receipts
reported, held ``over_budget`` once spent, seen in health, the console and ``/metrics``, read by the
agent through ``promptyoself_budget``, set from the CLI, REST and console like the other guardrails.

The decision is pure (``delivery.budget.decide``); the sums are read by the claim in its own
transaction (``store.day_counts``), on SQLite and PostgreSQL, through the real delivery against the
fake Letta (100 prompt + 5 completion tokens a turn). The acceptance test with the real Claude Code
(its reported ``total_cost_usd``) is tests/test_cost_budget_claude.py."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from fastapi.testclient import TestClient
from fastmcp import Client
from pydantic import SecretStr

from promptyoself.core import agent_tokens
from promptyoself.core.operations import Core
from promptyoself.delivery.budget import decide
from promptyoself.delivery.metrics import registry_for, render
from promptyoself.faces import cli
from promptyoself.faces.mcp import build_server
from promptyoself.faces.rest import build_rest_app
from promptyoself.store import alerts as stored_alerts
from promptyoself.store import receipts as stored_receipts
from promptyoself.store.operator import spend_by_agent
from promptyoself.store.records import DayCount
from promptyoself.targets.base import Receipt
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import T0, Clock, add_schedule, history, make_core, make_settings
from tests.test_guardrails import drain

UTC_ZONE = ZoneInfo("UTC")


class Claimed:
    """What ``decide`` reads of a claimed row."""

    def __init__(self, max_per_day: int | None = None) -> None:
        self.id, self.agent_id, self.max_per_day, self.day = 7, "agent-x", max_per_day, None


# ---- the decision: pure --------------------------------------------------------------------------


def test_a_spent_token_or_cost_budget_holds_with_the_reason() -> None:
    under = DayCount(0, 3, 0, 0, tokens_today=99, cost_usd_today=0.49, token_cap=100, cost_cap_usd=0.5)
    assert decide(Claimed(), under, UTC_ZONE).over is None
    tokens = DayCount(0, 3, 0, 2, tokens_today=100, cost_usd_today=0.0, token_cap=100)
    verdict = decide(Claimed(), tokens, UTC_ZONE)
    assert verdict.over == ("over_budget: agent agent-x spent 100 tokens today, its daily token budget (the "
                            "operator's policy max_tokens_per_agent_per_day=100); not sent. The budget resets at "
                            "midnight UTC.")
    assert verdict.held_back == 2
    cost = DayCount(0, 3, 0, 0, tokens_today=10, cost_usd_today=0.000105, cost_cap_usd=0.0001)
    assert decide(Claimed(), cost, ZoneInfo("Europe/Berlin")).over == (
        "over_budget: agent agent-x spent $0.000105 today, its daily cost budget (the operator's policy "
        "max_cost_usd_per_agent_per_day=0.0001); not sent. The budget resets at midnight Europe/Berlin.")
    # no cap: nothing held however much was spent; the delivery budget is named first when both are spent
    assert decide(Claimed(), DayCount(0, 3, 0, 0, 10**9, 1e6), UTC_ZONE).over is None
    both = DayCount(3, 3, 0, 0, tokens_today=500, token_cap=100)
    assert "max_deliveries_per_agent_per_day=3" in (decide(Claimed(), both, UTC_ZONE).over or "")


def test_a_receipt_counts_its_input_and_output_tokens_and_cost_only_when_complete() -> None:
    assert Receipt(input_tokens=100, output_tokens=5, cost_usd=0.25).spend() == (105, 0.25)
    assert Receipt(output_tokens=5).spend() == (5, None)
    assert Receipt(cost_usd=1e30).spend() == (None, 1e9)  # bounded: a target cannot overflow the day
    assert Receipt(state="pending", input_tokens=100).spend() == (None, None)
    assert Receipt.none("no receipt").spend() == (None, None)


# ---- the policy: CLI, REST --------------------------------------------------------------------------


def test_the_cost_budgets_are_set_from_the_cli(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    core = make_core(db_path)
    try:
        code = cli.main(["--json", "policy", "set", "max_tokens_per_agent_per_day=250000",
                         "max_cost_usd_per_agent_per_day=2.50"], core=core)
        out = json.loads(capsys.readouterr().out)
        assert code == 0, out
        assert out["policy"]["max_tokens_per_agent_per_day"] == 250000
        assert out["policy"]["max_cost_usd_per_agent_per_day"] == 2.5
        entries = {e["name"]: e for e in out["policy_entries"]}
        assert entries["max_cost_usd_per_agent_per_day"]["source"] == "database"
        code = cli.main(["--json", "policy", "set", "max_cost_usd_per_agent_per_day=-1"], core=core)
        bad = json.loads(capsys.readouterr().out)
        assert code != 0 and bad["code"] == "invalid_argument" and "US dollars" in json.dumps(bad)
        assert asyncio.run(core.operator.policy()).max_cost_usd_per_agent_per_day == 2.5  # nothing changed
        p = asyncio.run(core.recent_policy(core.now()))
        assert (p.max_tokens_per_agent_per_day, p.max_cost_usd_per_agent_per_day) == (250000, 2.5)
    finally:
        core.close()


def test_the_cost_budgets_are_set_over_rest_by_the_operator_only(db_path: Path) -> None:
    core = make_core(db_path, http_token="operator-token-123456")
    token = asyncio.run(agent_tokens.mint(core, "agent-a"))["token"]
    try:
        with TestClient(build_rest_app(core)) as http:
            auth = {"Authorization": "Bearer operator-token-123456"}
            put = http.put("/api/policy", headers=auth, json={"max_tokens_per_agent_per_day": 1000,
                                                              "max_cost_usd_per_agent_per_day": 0.75})
            assert put.status_code == 200, put.text
            assert put.json()["policy"]["max_tokens_per_agent_per_day"] == 1000
            assert put.json()["policy"]["max_cost_usd_per_agent_per_day"] == 0.75
            bad = http.put("/api/policy", headers=auth, json={"max_cost_usd_per_agent_per_day": "lots"})
            assert bad.status_code == 400 and bad.json()["code"] == "invalid_argument"
            theirs = http.put("/api/policy", headers={"Authorization": f"Bearer {token}"},
                              json={"max_cost_usd_per_agent_per_day": 100})
            assert theirs.status_code == 403
            assert http.get("/api/policy", headers=auth).json()["policy"]["max_cost_usd_per_agent_per_day"] == 0.75
    finally:
        core.close()


def test_the_console_sets_the_cost_budgets_and_shows_what_each_agent_spent(db_path: Path) -> None:
    import re

    from promptyoself.faces.console import build_console

    clock = Clock(T0)
    core = make_core(db_path, clock=clock)
    sid = add_schedule(core.store, "agent-c", "p", T0 + timedelta(hours=1))
    with core.store.session() as s:
        from promptyoself.store.db import Delivery

        s.add(Delivery(schedule_id=sid, agent_id="agent-c", scheduled_for=T0 - timedelta(minutes=2),
                       attempted_at=T0 - timedelta(minutes=1), outcome="delivered", attempt=1,
                       receipt_state="complete", tokens=1234, cost_usd=0.75))
    try:
        with TestClient(build_console(core), base_url="http://127.0.0.1") as http:
            page = http.get("/console/policy")
            assert page.status_code == 200 and 'name="max_cost_usd_per_agent_per_day"' in page.text
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert csrf is not None
            saved = http.post("/console/policy", data={"csrf": csrf.group(1), "max_tokens_per_agent_per_day": "5000",
                                                       "max_cost_usd_per_agent_per_day": "0.5"}, follow_redirects=False)
            assert saved.status_code == 303
            p = asyncio.run(core.operator.policy())
            assert (p.max_tokens_per_agent_per_day, p.max_cost_usd_per_agent_per_day) == (5000, 0.5)
            bad = http.post("/console/policy", data={"csrf": csrf.group(1), "max_cost_usd_per_agent_per_day": "$5"})
            assert bad.status_code == 400 and "max_cost_usd_per_agent_per_day takes" in bad.text
            agents = http.get("/console/agents").text
            assert "<td>1234 of 5000</td>" in agents and "0.75 of 0.5" in agents
            held = http.get("/console/agents/agent-c").text
            assert 'id="agent-held"' in held and "max_cost_usd_per_agent_per_day=0.5" in held
            home = http.get("/console").text
            assert 'id="held-by-cost"' in home and "agent-c" in home and "USD per agent per day" in home
    finally:
        core.close()


# ---- the sums and the hold, through the real delivery, SQLite and PostgreSQL -------------------------


@pytest.mark.slow
def test_a_token_budget_holds_an_agent_once_its_receipts_reach_it_sqlite(db_path: Path, fake_letta: FakeLetta) -> None:
    token_day(str(db_path), fake_letta)


@pytest.mark.slow
@pytest.mark.postgres
def test_a_token_budget_holds_an_agent_once_its_receipts_reach_it_pg(pg_url: str, fake_letta: FakeLetta) -> None:
    token_day(pg_url, fake_letta)


def token_day(db: str, fake: FakeLetta) -> None:
    """Budget 150 tokens; each turn of the fake reports 105: the second turn passes the budget and is
    delivered (its cost is known only after it ran), the third is held with the reason; another agent
    is not; the next day the agent is delivered again."""
    clock = Clock(T0)
    core = make_core(db, fake, clock=clock)
    agent, other = fake.agent_ids[0], fake.agent_ids[1]
    try:
        asyncio.run(core.operator.policy_set({"max_tokens_per_agent_per_day": 150}))
        due = T0 - timedelta(minutes=5)
        first = add_schedule(core.store, agent, "first", due)
        assert drain(core) == ["delivered"]
        usage = asyncio.run(core.operator.agent_usage(agent))
        assert usage["tokens_today"] == 105 and usage["tokens_left"] == 45 and usage["held_by"] is None
        second = add_schedule(core.store, agent, "second", due + timedelta(seconds=1))
        assert drain(core) == ["delivered"]
        third = add_schedule(core.store, agent, "third", due + timedelta(seconds=2))
        theirs = add_schedule(core.store, other, "another agent", due + timedelta(seconds=3))
        assert sorted(drain(core)) == ["delivered", "over_budget"]
        rows = {d.schedule_id: d for d in history(core.store)}
        assert rows[first].tokens == 105 and rows[second].tokens == 105 and rows[first].cost_usd is None
        held = rows[third]
        assert held.outcome == "over_budget" and held.tokens is None
        assert held.error == (f"over_budget: agent {agent} spent 210 tokens today, its daily token budget (the "
                              "operator's policy max_tokens_per_agent_per_day=150); not sent. The budget resets at "
                              "midnight UTC.")
        assert rows[theirs].outcome == "delivered"
        assert not any("third" in t for t in fake.received_texts())

        # the operator sees it: health, /metrics, an alert, the agent's usage
        guard = asyncio.run(core.health())["guardrails"]
        assert guard["max_tokens_per_agent_per_day"] == 150
        assert [h["agent_id"] for h in guard["held_by_cost"]] == [agent]
        assert guard["held_by_cost"][0]["tokens_today"] == 210 and guard["over_budget_today"] == 1
        text = render(registry_for(core)).decode()
        assert f'promptyoself_tokens_today{{agent_id="{agent}"}} 210.0' in text
        assert f'promptyoself_tokens_today{{agent_id="{other}"}} 105.0' in text
        assert 'promptyoself_guardrail_limit{guardrail="max_tokens_per_agent_per_day"} 150.0' in text
        assert stored_alerts.by_kind(core.store).get("over_budget") == 1
        assert asyncio.run(core.operator.agent_usage(agent))["held_by"] == held.error
        assert spend_by_agent(core.store, T0.replace(hour=0)) == {agent: (210, 0.0), other: (105, 0.0)}

        clock.set(T0 + timedelta(days=1))  # a new budget day: the sums start again
        add_schedule(core.store, agent, "the next day", clock.now - timedelta(seconds=1))
        assert drain(core) == ["delivered"]
        assert asyncio.run(core.operator.agent_usage(agent))["tokens_today"] == 105
        assert asyncio.run(core.health())["guardrails"]["held_by_cost"] == []
    finally:
        core.close()


@pytest.mark.postgres
async def test_a_receipt_completed_later_counts_its_cost_postgres(pg_url: str) -> None:
    await receipt_completed_later(pg_url)


async def test_a_receipt_completed_later_counts_its_cost_sqlite(db_path: Path) -> None:
    await receipt_completed_later(str(db_path))


async def receipt_completed_later(db: str) -> None:
    """A delivered row with a pending receipt costs nothing until the receipt task completes it; then
    its tokens and USD count in the day's sums (the claim's count, ``recent`` and the per-agent sums)."""
    clock = Clock(T0)
    core = make_core(db, clock=clock)
    try:
        sid = add_schedule(core.store, "agent-p", "p", T0 + timedelta(hours=1))  # not due: "next" is claimed
        with core.store.session() as s:
            from promptyoself.store.db import Delivery

            row = Delivery(schedule_id=sid, agent_id="agent-p", scheduled_for=T0 - timedelta(minutes=1),
                           attempted_at=T0 - timedelta(seconds=30), outcome="delivered", attempt=1,
                           receipt_state="pending", receipt=Receipt(state="pending").to_json())
            s.add(row)
            s.flush()
            delivery_id = row.id
        since = datetime(2026, 6, 15, tzinfo=UTC)
        assert (await core.deliveries.recent(since, 10, agent_id="agent-p", spend=True)).tokens_today == 0
        done = Receipt(input_tokens=1200, output_tokens=34, cost_usd=0.0125)
        tokens, cost = done.spend()
        assert stored_receipts.complete(core.store, delivery_id, "complete", done.to_json(), tokens=tokens,
                                        cost_usd=cost)
        day = await core.deliveries.recent(since, 10, agent_id="agent-p", spend=True, until=T0)
        assert (day.delivered_today, day.tokens_today, day.cost_usd_today) == (1, 1234, 0.0125)
        assert spend_by_agent(core.store, since, T0) == {"agent-p": (1234, 0.0125)}
        # the claim counts it in its own transaction, when a cost budget is set
        await core.operator.policy_set({"max_cost_usd_per_agent_per_day": "0.01"})
        add_schedule(core.store, "agent-p", "next", T0 - timedelta(seconds=1))
        claimed = await core.deliveries.claim("owner-1", T0, T0 + timedelta(minutes=1), limit=5)
        [mine] = [c for c in claimed if c.prompt_text == "next"]
        assert mine.day is not None and mine.day.cost_usd_today == 0.0125 and mine.day.cost_cap_usd == 0.01
        assert mine.day.tokens_today == 1234
        assert "spent $0.0125 today" in (decide(mine, mine.day, UTC_ZONE).over or "")
    finally:
        core.close()


# ---- the agent's tool -----------------------------------------------------------------------------


async def test_an_agent_reads_its_own_budgets_through_the_tool(db_path: Path) -> None:
    clock = Clock(T0)
    operator = make_core(db_path, clock=clock, max_deliveries_per_agent_per_day=10)
    await operator.operator.policy_set({"max_tokens_per_agent_per_day": 1000,
                                        "max_cost_usd_per_agent_per_day": "0.5"})
    sid = add_schedule(operator.store, "agent-a", "p", T0 - timedelta(minutes=2))
    with operator.store.session() as s:
        from promptyoself.store.db import Delivery

        s.add(Delivery(schedule_id=sid, agent_id="agent-a", scheduled_for=T0 - timedelta(minutes=2),
                       attempted_at=T0 - timedelta(minutes=1), outcome="delivered", attempt=1,
                       receipt_state="complete", tokens=400, cost_usd=0.5))
    token = (await agent_tokens.mint(operator, "agent-a"))["token"]
    agent = Core(make_settings(db_path, agent_token=SecretStr(token)), clock=clock)
    try:
        async with Client(build_server(agent)) as c:
            got = await c.call_tool("promptyoself_budget", {})
            answer: dict[str, Any] = dict(got.structured_content or {})
            usage = answer["usage"]
            assert answer["agent_id"] == "agent-a" and answer["budget_timezone"] == "UTC"
            assert answer["day_started"] == "2026-06-15T00:00:00+00:00"
            assert answer["resets_at"] == "2026-06-16T00:00:00+00:00"
            assert (usage["delivered_today"], usage["daily_budget"], usage["budget_left"]) == (1, 10, 9)
            assert (usage["tokens_today"], usage["token_budget"], usage["tokens_left"]) == (400, 1000, 600)
            assert (usage["cost_usd_today"], usage["cost_budget_usd"], usage["cost_left_usd"]) == (0.5, 0.5, 0.0)
            assert usage["held_by"] is not None and "max_cost_usd_per_agent_per_day=0.5" in usage["held_by"]
            assert "Your next prompts are held" in answer["message"]
            refused = await c.call_tool("promptyoself_budget", {"agent_id": "agent-b"}, raise_on_error=False)
            assert refused.is_error and json.loads(refused.content[0].text)["code"] == "forbidden"
        async with Client(build_server(operator)) as c:  # the operator names any agent
            other = await c.call_tool("promptyoself_budget", {"agent_id": "agent-b"})
            assert dict(other.structured_content or {})["usage"]["tokens_today"] == 0
    finally:
        agent.close()
        operator.close()


def test_the_cli_guardrail_line_shows_the_cost_budgets() -> None:
    from promptyoself.faces.tables import guardrail_line

    usage = {"delivered_today": 2, "daily_budget": 500, "held_back": 1, "created_last_hour": 1, "hourly_limit": 60,
             "tokens_today": 1234, "token_budget": 5000, "cost_usd_today": 0.75, "cost_budget_usd": 0.5}
    assert guardrail_line({"usage": usage}) == (
        "Guardrails: 2 of 500 delivered today, 1 held back over budget, 1234 of 5000 tokens today, 0.75 of 0.5 USD "
        "today; 1 of 60 schedules made in the last hour; approval off.")
    limits = {"max_deliveries_per_agent_per_day": 500, "max_tokens_per_agent_per_day": 0,
              "max_cost_usd_per_agent_per_day": 2.5}
    assert guardrail_line(limits) == ("Guardrails: 500 deliveries per agent a day; 2.5 USD per agent a day; no limit "
                                      "of schedules per agent an hour; approval off.")
