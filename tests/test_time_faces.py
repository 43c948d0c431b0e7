"""Issue 21 through every face: the MCP tools, the CLI and the REST API take natural times, rules in
words and RRULEs, a zone inside the time, and ``catch_up``; each result carries ``upcoming`` and
``description``. The Letta scheduling API's responses keep their shape."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from fastmcp import Client

from promptyoself.core.operations import Core
from promptyoself.faces import cli, tables
from promptyoself.faces.mcp import build_server
from promptyoself.faces.rest import build_rest_app
from testkit.fake_letta import FakeLetta
from tests.conftest import FIXED_NOW, make_settings

# FIXED_NOW is Monday 2026-06-15 12:00 UTC (14:00 in Berlin)


@pytest.fixture
def fake() -> Iterator[FakeLetta]:
    with FakeLetta(agents=1) as f:
        yield f


@pytest.fixture
def tcore(db_path: Path, fake: FakeLetta) -> Iterator[Core]:
    c = Core(make_settings(db_path, letta_base_url=fake.url, http_token="t"), clock=lambda: FIXED_NOW)
    yield c
    c.close()


@pytest.fixture
async def client(tcore: Core) -> AsyncIterator[Client[Any]]:
    async with Client(build_server(tcore)) as c:
        yield c


async def call(client: Client[Any], tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args, raise_on_error=False)
    if result.is_error:
        return dict(json.loads(result.content[0].text))
    return dict(result.structured_content)


@pytest.mark.slow
async def test_mcp_natural_time_with_its_zone(client: Client[Any], fake: FakeLetta) -> None:
    r = await call(client, "promptyoself_schedule_time", {
        "prompt": "p", "time": "tomorrow at 9am europe/berlin", "agent_id": fake.agent_ids[0]})
    assert r["timezone"] == "Europe/Berlin"  # the zone written in the time is the schedule's
    assert r["next_run"] == "2026-06-16T07:00:00+00:00" and r["next_run_local"] == "2026-06-16T09:00:00+02:00"
    assert r["upcoming"] == ["2026-06-16T09:00:00+02:00"]
    assert r["description"] == "Once, on Tuesday 16 June 2026 at 09:00 CEST (Europe/Berlin)"
    assert r["catch_up"] == "latest"


@pytest.mark.slow
async def test_mcp_rules_in_words_and_rrule(client: Client[Any], fake: FakeLetta) -> None:
    r = await call(client, "promptyoself_schedule_cron", {
        "prompt": "standup", "cron": "every weekday at 9", "timezone": "Europe/Berlin",
        "agent_id": fake.agent_ids[0], "catch_up": "skip"})
    assert r["schedule_type"] == "rrule" and r["schedule_value"].startswith("FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR")
    assert r["upcoming"][:2] == ["2026-06-16T09:00:00+02:00", "2026-06-17T09:00:00+02:00"] and len(r["upcoming"]) == 5
    assert r["description"] == "Every weekday at 09:00 (Europe/Berlin)" and r["catch_up"] == "skip"
    r = await call(client, "promptyoself_schedule_cron", {
        "prompt": "retro", "cron": "FREQ=WEEKLY;INTERVAL=2;BYDAY=TU,TH;BYHOUR=10;BYMINUTE=0;COUNT=3",
        "timezone": "America/New_York", "agent_id": fake.agent_ids[0]})
    assert len(r["upcoming"]) == 3 and r["upcoming"][0] == "2026-06-16T10:00:00-04:00"
    listed = await call(client, "promptyoself_list", {"agent_id": fake.agent_ids[0]})
    assert listed["schedules"][0]["description"] == "Every weekday at 09:00 (Europe/Berlin)"
    assert all(len(s["upcoming"]) >= 3 and s["catch_up"] for s in listed["schedules"])


@pytest.mark.slow
async def test_mcp_errors_name_what_to_write(client: Client[Any], fake: FakeLetta) -> None:
    agent = fake.agent_ids[0]
    r = await call(client, "promptyoself_schedule_time", {"prompt": "p", "time": "friday", "agent_id": agent})
    assert r["code"] == "invalid_time" and "names a day but not the time" in r["error"]
    r = await call(client, "promptyoself_schedule_time", {"prompt": "p", "time": "today 9:00", "agent_id": agent,
                                                           "timezone": "Europe/Berlin"})
    assert r["code"] == "time_in_past"
    r = await call(client, "promptyoself_schedule_cron", {"prompt": "p", "cron": "every weekday", "agent_id": agent})
    assert r["code"] == "invalid_cron" and "at what time" in r["error"]
    r = await call(client, "promptyoself_schedule_cron", {"prompt": "p", "cron": "every day at 9", "agent_id": agent,
                                                           "timezone": "Berlin"})
    assert r["code"] == "invalid_argument" and "Did you mean 'Europe/Berlin'" in r["error"]
    r = await call(client, "promptyoself_schedule_every", {"prompt": "p", "every": "1h", "agent_id": agent,
                                                            "catch_up": "sometimes"})
    assert r["code"] == "invalid_argument"


def test_cli_cron_in_words_catch_up_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTYOSELF_DB", str(tmp_path / "cli.db"))
    monkeypatch.setenv("PROMPTYOSELF_EXECUTOR_MODE", "off")
    code = cli.main(["--json", "schedule", "--prompt", "standup", "--cron", "every weekday at 9", "--timezone",
                     "europe/berlin", "--agent-id", "agent-1", "--skip-validation", "--catch-up", "all"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["timezone"] == "Europe/Berlin" and out["catch_up"] == "all" and len(out["upcoming"]) == 5
    assert out["description"] == "Every weekday at 09:00 (Europe/Berlin)"
    text = tables.render(out)
    assert "upcoming" in text and re.search(r"09:00:00 \+0[12]:00 CES?T", text), text


def test_terminal_times_carry_the_zone() -> None:
    assert tables.show_time("2026-12-25T08:00:00+00:00", tables.row_zone({"timezone": "Europe/Berlin"},
                                                                          tables.ZoneInfo("UTC"))) == (
        "2026-12-25 09:00:00 +01:00 CET")
    assert tables.show_time("2026-12-25T08:00:00+00:00", tables.ZoneInfo("UTC")) == "2026-12-25 08:00:00 +00:00 UTC"


@pytest.mark.slow
def test_rest_takes_catch_up_and_words_and_letta_api_is_unchanged(tcore: Core, fake: FakeLetta) -> None:
    agent = fake.agent_ids[0]
    with TestClient(build_rest_app(tcore), headers={"Authorization": "Bearer t"}) as c:
        r = c.post("/api/schedules/cron", json={"prompt": "p", "cron": "last friday of every month at 17:00",
                                                 "timezone": "Europe/Berlin", "agent_id": agent, "catch_up": "skip"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["upcoming"][0] == "2026-06-26T17:00:00+02:00" and body["catch_up"] == "skip"
        bad = c.post("/api/schedules/time", json={"prompt": "p", "time": "tomorrow 9", "agent_id": agent,
                                                   "catch_up": "never"})
        assert bad.status_code == 422
        letta = c.post(f"/v1/agents/{agent}/schedule", json={
            "schedule": {"type": "recurring", "cron_expression": "0 9 * * *"},
            "messages": [{"role": "user", "content": "hi"}]})
        assert letta.status_code == 200, letta.text
        assert set(letta.json()) == {"id", "next_scheduled_at"}
        listed = c.get(f"/v1/agents/{agent}/schedule").json()
        assert set(listed["scheduled_messages"][0]) == {"id", "agent_id", "message", "next_scheduled_time", "schedule"}
        assert datetime.fromisoformat(listed["scheduled_messages"][0]["next_scheduled_time"])


@pytest.mark.slow
def test_a_zone_in_start_at_is_the_interval_schedules_zone(tcore: Core, fake: FakeLetta) -> None:
    r = asyncio.run(tcore.scheduling.schedule_every("p", "1d", start_at="tomorrow 9am Europe/Berlin",
                                                    agent_id=fake.agent_ids[0],
                             skip_validation=True))
    assert r["timezone"] == "Europe/Berlin" and r["next_run_local"] == "2026-06-16T09:00:00+02:00"
    assert r["upcoming"][1] == "2026-06-17T09:00:00+02:00" and r["description"] == "Every 1d"
