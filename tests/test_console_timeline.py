"""The console's timeline page (issue 32 point 6): the next 7 days of runs per agent and the last 24
hours of deliveries by outcome, drawn as inline SVG (no JavaScript, nothing fetched), linked from the
home page and each agent's page. A fixed ``now``, a fixed set of schedules and history rows, a real
SQLite file, the service's app in process (TestClient)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from promptyoself.core.operations import Core
from promptyoself.core.timeline import MAX_RUNS
from promptyoself.faces.http import build_service_app
from promptyoself.store.db import Delivery
from tests.helpers_delivery import T0, Clock, make_settings

TOKEN = "timeline-console-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def page(db_path: Path) -> Iterator[tuple[Core, TestClient]]:
    settings = make_settings(db_path, letta_base_url="http://127.0.0.1:9", http_token=TOKEN)
    core = Core(settings, clock=Clock(T0))  # Monday 2026-06-15 12:00 UTC
    opts = {"skip_validation": True}
    asyncio.run(core.scheduling.schedule_cron("daily", "0 13 * * *", agent_id="agent-a", **opts))  # 15th..21st: 7 runs
    asyncio.run(core.scheduling.schedule_cron("weekdays", "30 9 * * MON-FRI", agent_id="agent-b",
                                              **opts))  # Tue..Fri, Mon 22nd: 5
    asyncio.run(core.scheduling.schedule_time("once", "2026-06-17T12:00:00Z", agent_id="agent-c", **opts))  # 1
    paused = asyncio.run(core.scheduling.schedule_cron("paused", "0 * * * *", agent_id="agent-d", **opts))
    asyncio.run(core.scheduling.pause(paused["id"]))  # not drawn
    with core.store.session() as s:
        def add(hours_ago: float, outcome: str, agent: str = "agent-a") -> None:
            at = T0 - timedelta(hours=hours_ago)
            s.add(Delivery(schedule_id=1, agent_id=agent, scheduled_for=at, attempted_at=at, outcome=outcome,
                           attempt=1))
        # in time order, as history is written (ids grow with time)
        add(30, "missed")  # older than 24 hours: not counted
        add(5.3, "delivered", "agent-b")  # 06:00-07:00
        add(5.2, "delivered", "agent-b")
        add(0.6, "failed")  # 11:00-12:00
        for _ in range(3):
            add(0.5, "delivered")
    client = TestClient(build_service_app(core, settings, delivery=False), base_url="http://127.0.0.1:8000",
                        follow_redirects=False)  # (no lifespan: nothing of it is needed here)
    yield core, client
    client.close()
    core.close()


def svg(html: str, chart_id: str) -> str:
    found = re.search(rf'<svg id="{chart_id}".*?</svg>', html, re.S)
    assert found, f"no <svg id={chart_id}>"
    return found.group(0)


def test_the_timeline_draws_every_run_of_the_next_7_days_and_the_last_24_hours(page: tuple[Core, TestClient]) -> None:
    _, client = page
    r = client.get("/console/timeline", headers=AUTH)
    assert r.status_code == 200
    html = r.text
    assert "<script" not in html
    runs = svg(html, "runs-chart")
    for chart in (runs, svg(html, "deliveries-chart")):  # nothing fetched: no URL but the SVG namespace
        assert "//" not in chart.replace("http://www.w3.org/2000/svg", "")
    assert runs.count('class="run"') == 13
    rows = re.findall(r'<g class="agent-row" data-agent="([^"]+)">', runs)
    assert rows == ["agent-a", "agent-b", "agent-c"], "one row per agent with runs, paused schedules left out"
    row_a = runs.split('data-agent="agent-a"')[1].split("</g>")[0]
    assert row_a.count('class="run"') == 7 and 'href="/console/schedules/1"' in row_a
    assert runs.count('class="day"') == 7, "a line at each midnight between now and 7 days on"
    bars = svg(html, "deliveries-chart")
    assert bars.count('class="bar ') == 3, "11:00 delivered + failed, 06:00 delivered"
    assert bars.count('class="bar out-delivered"') == 2 and bars.count('class="bar out-failed"') == 1
    assert bars.count('<g class="hour"') == 24
    assert "delivered (5)" in bars and "failed (1)" in bars and "missed (0)" in bars


def test_one_agents_timeline(page: tuple[Core, TestClient]) -> None:
    _, client = page
    html = client.get("/console/timeline?agent=agent-b", headers=AUTH).text
    runs = svg(html, "runs-chart")
    assert runs.count('class="run"') == 5 and re.findall(r'data-agent="([^"]+)"', runs) == ["agent-b"]
    assert svg(html, "deliveries-chart").count('class="bar ') == 1
    assert client.get("/console/timeline?agent=nobody", headers=AUTH).text.count('class="run"') == 0


def test_linked_from_the_home_page_and_each_agents_page(page: tuple[Core, TestClient]) -> None:
    _, client = page
    assert 'href="/console/timeline"' in client.get("/", headers=AUTH).text
    assert 'href="/console/timeline?agent=agent-a"' in client.get("/console/agents/agent-a", headers=AUTH).text
    assert client.get("/console/timeline").status_code == 303, "behind the sign-in like every page"


def test_the_work_is_bounded(page: tuple[Core, TestClient]) -> None:
    core, client = page
    asyncio.run(core.scheduling.schedule_every("flood", "10s", agent_id="agent-e",
                                               skip_validation=True))  # 60,480 runs in a week
    for i in range(MAX_RUNS // 100 + 1):  # more marks than drawn: 4 hourly schedules, each 167 runs (from now + 1h)
        asyncio.run(core.scheduling.schedule_every(f"hourly {i}", "1h", agent_id="agent-f", skip_validation=True))
    html = client.get("/console/timeline", headers=AUTH).text
    runs = svg(html, "runs-chart")
    row_e = runs.split('data-agent="agent-e"')[1].split("</g>")[0]
    assert row_e.count('class="run"') == 0 and row_e.count('class="band"') == 1, "a dense schedule is one band"
    row_f = runs.split('data-agent="agent-f"')[1].split("</g>")[0]
    assert row_f.count('class="run"') == MAX_RUNS
    assert f"agent-f: {4 * 167 - MAX_RUNS} more runs not drawn" in html
