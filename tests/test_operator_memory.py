"""The operator's read model and policy (``core/operator.py``, ``core/agent_tokens.py``) on the one
async store interface, run on the in-memory store, SQLite and PostgreSQL alike (as
``test_scheduling_memory.py``): the console's pages, ``policy show`` / ``set``,
the guardrails' summary, agent tokens. On memory nothing opens the database."""

from __future__ import annotations

from typing import Any

import pytest

from promptyoself.core import agent_tokens
from promptyoself.core.operator import guardrail_summary
from promptyoself.errors import InvalidArgument, NotFound, QuotaExceeded
from tests.engine_kit import T0

AGENT = "agent-a"


def opts(agent: str = AGENT, **extra: Any) -> dict[str, Any]:
    return {"agent_id": agent, "skip_validation": True, **extra}


async def test_the_console_pages_read_the_stores_rows(make: Any) -> None:
    core = make()
    first = await core.scheduling.schedule_time("once", "in 5m", **opts())
    every = await core.scheduling.schedule_every("often", "30m", **opts("agent-b"))
    await core.scheduling.cancel(first["id"])
    live = await core.operator.console_schedules()
    assert [v["schedule"]["id"] for v in live["schedules"]] == [every["id"]] and live["total"] == 1
    everything = await core.operator.console_schedules(state="all")
    assert [v["schedule"]["id"] for v in everything["schedules"]] == [every["id"], first["id"]]  # newest first
    mine = await core.operator.console_schedules(agent_id=AGENT, state="cancelled")
    assert mine["count"] == 1 and mine["schedules"][0]["schedule"]["state"] == "cancelled"
    assert (await core.operator.console_schedules(state="all", limit=1, offset=1))["schedules"][0]["schedule"][
        "id"] == first["id"]
    with pytest.raises(InvalidArgument, match="state must be"):
        await core.operator.console_schedules(state="sleeping")
    view = await core.operator.console_schedule(every["id"])
    assert view["schedule"]["state"] == "active" and view["rule"] and view["deliveries"] == []
    with pytest.raises(NotFound):
        await core.operator.console_schedule(999)
    assert await core.operator.console_agent_ids() == [AGENT, "agent-b"]
    agents, total = await core.operator.console_agents()
    assert total == 2 and agents[0]["states"] == {"cancelled": 1} and agents[1]["states"] == {"active": 1}
    assert await core.operator.pending_approval_count() == 0
    today = await core.operator.today()
    assert today["day_started"] is not None and today["delivered"] == 0 and today["over_budget"] == 0


async def test_policy_show_and_set_on_each_store(make: Any) -> None:
    core = make(max_schedules_per_agent_per_hour=30)
    shown = await core.operator.policy_show()
    entries = {e["name"]: e for e in shown["policy_entries"]}
    assert shown["policy"]["max_schedules_per_agent_per_hour"] == 30
    assert entries["max_schedules_per_agent_per_hour"]["source"] == "environment seed"
    assert entries["max_active_per_agent"]["source"] == "default"
    result = await core.operator.policy_set({"max-active-per-agent": "3", "approval_below": "10m"})
    assert result["message"].startswith("Policy set: max_active_per_agent=3, approval_below=10m.")
    assert result["policy"]["max_active_per_agent"] == 3 and result["policy"]["approval_below"] == "10m"
    again = {e["name"]: e for e in (await core.operator.policy_show())["policy_entries"]}
    assert again["max_active_per_agent"]["source"] == "database"
    assert again["max_active_per_agent"]["origin"] == f"set by an operator at {T0.isoformat()}"
    with pytest.raises(InvalidArgument):
        await core.operator.policy_set({"max_active_per_agent": "0"})
    with pytest.raises(InvalidArgument, match="Unknown policy value"):
        await core.operator.policy_set({"nonsense": "1"})
    assert (await core.operator.policy()).max_active_per_agent == 3  # what every writer enforces
    await core.scheduling.schedule_time("a", "in 5m", **opts())
    await core.scheduling.schedule_time("b", "in 6m", **opts())
    await core.scheduling.schedule_time("c", "in 7m", **opts())
    with pytest.raises(QuotaExceeded):
        await core.scheduling.schedule_time("d", "in 8m", **opts())
    await core.operator.policy_set({"max_deliveries_per_agent_per_day": 4, "pause_after_failures": 2})
    assert (await core.recent_policy(T0)).max_deliveries_per_agent_per_day == 4
    assert (await core.recent_policy(T0)).pause_after_failures == 2
    assert (await core.budget_day(T0)).agent_cap == 4  # what the engine's claims count against


async def test_the_guardrails_summary_on_each_store(make: Any) -> None:
    core = make(max_tokens_per_agent_per_day=100)
    guard = await guardrail_summary(core.settings, core.deliveries, core.now())
    assert guard["max_tokens_per_agent_per_day"] == 100 and guard["pending_approval"] == 0
    assert guard["over_budget_today"] == 0 and guard["held_by_cost"] == []


async def test_agent_tokens_on_each_store(make: Any) -> None:
    core = make()
    first = await agent_tokens.mint(core, AGENT)
    assert await agent_tokens.resolve(core, first["token"]) == AGENT
    assert await agent_tokens.resolve(core, first["token"] + "x") is None
    second = await agent_tokens.mint(core, AGENT, rotate=True)
    assert await agent_tokens.resolve(core, first["token"]) is None
    assert [t["id"] for t in (await agent_tokens.listing(core, AGENT))["tokens"]] == [second["id"]]
    assert len((await agent_tokens.listing(core, AGENT, include_revoked=True))["tokens"]) == 2
    made = await core.scheduling.schedule_time("p", "in 5m", **opts())
    await agent_tokens.own_schedule(core, AGENT, made["id"])
    with pytest.raises(NotFound):
        await agent_tokens.own_schedule(core, "agent-z", made["id"])
    assert (await agent_tokens.revoke(core, agent_id=AGENT))["revoked"] == 1
    with pytest.raises(NotFound):
        await agent_tokens.revoke(core, agent_id=AGENT)
