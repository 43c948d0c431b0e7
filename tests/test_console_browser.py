"""The operator console in a real browser (issue 22, point 3): headless Chromium from Debian's packages
(``apt-get install chromium``) driven by Playwright for Python with the system Chromium as its
executable (never ``playwright install``), against a real ``promptyoself serve`` process, a real
SQLite file and the fake Letta over HTTP. Sign in, filter, pause, run now (twice: the second time the
schedule's ``max_per_day`` holds it back), cancel with its confirmation, approve, the agent view; one
screenshot per step.

Screenshots go to a temporary folder, or to ``$CONSOLE_SCREENSHOTS`` when set: ``docs/console``
refreshes the ones docs/console.md shows. Without Chromium or Playwright the tests skip, saying why.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import child_env, make_core

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TOKEN = "console-demo-token"


def _browser_or_skip() -> Any:
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        msg = f"Chromium is not installed at {CHROMIUM} (apt-get install chromium); browser tests skipped"
        print(msg)  # noqa: T201 (the reason, also in pytest's -ra summary)
        pytest.skip(msg)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        msg = "Playwright for Python is not installed (pip install playwright); browser tests skipped"
        print(msg)  # noqa: T201
        pytest.skip(msg)
    return sync_playwright


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("CONSOLE_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def world(db: Path) -> Iterator[dict[str, Any]]:
    """A fake Letta with two agents, their schedules, and the service serving the console."""
    from tests.test_service import Service

    with FakeLetta(agents=2) as fake:
        ops, research = fake.agent_ids
        env = child_env(db, fake.url, PROMPTYOSELF_HTTP_TOKEN=TOKEN, PROMPTYOSELF_APPROVAL_BELOW="10m",
                        PROMPTYOSELF_EXECUTOR_INTERVAL="0.2", PROMPTYOSELF_TIMEZONE="Europe/Berlin")
        core = make_core(db, fake, approval_below="10m", timezone="Europe/Berlin")
        sched = core.scheduling
        ids = {
            "standup": asyncio.run(sched.schedule_cron("Run the morning standup: summarise yesterday's tickets.",
                                                       "0 9 * * MON-FRI", agent_id=ops,
                                                       timezone="Europe/Berlin"))["id"],
            "queue": asyncio.run(sched.schedule_every("Check the support queue and triage anything new.", "30m",
                                                      agent_id=ops, max_repetitions=20))["id"],
            "cert": asyncio.run(sched.schedule_time("Renew the TLS certificate for the docs site.", "in 2d",
                                                    agent_id=ops, timezone="America/New_York"))["id"],
            "inbox": asyncio.run(sched.schedule_every("Summarise the research inbox.", "4h", agent_id=research,
                                                      max_per_day=1))["id"],
            "poll": asyncio.run(sched.schedule_every("Poll the nightly build status.", "2m", agent_id=research))["id"],
            "hello": asyncio.run(sched.schedule_time("Say hello to the team.", "in 1s", agent_id=ops))["id"],
        }
        svc = Service(db, env)
        try:
            yield {"url": svc.url, "ids": ids, "core": core, "fake": fake, "svc": svc, "ops": ops,
                   "research": research}
        finally:
            svc.stop()
            core.close()


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def state(core: Any, sid: int) -> str:
    """A schedule's state, read with the store's own function (no event loop of ours in Playwright's)."""
    from promptyoself.store.schedules import get

    row = get(core.store, sid)
    assert row is not None
    return row.state


def test_console_in_chromium(world: dict[str, Any], shots: Path) -> None:
    sync_playwright = _browser_or_skip()
    url, ids = world["url"], world["ids"]
    ops, research = world["ops"], world["research"]
    core = world["core"]
    # the one-time hello is delivered by the service before the tour starts (history to show)
    wait_for(lambda: asyncio.run(core.operator.console_schedule(ids["hello"]))["schedule"]["state"] == "completed",
             "the first delivery")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1440, "height": 900})

        def shot(name: str) -> None:
            page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

        def row(key: str) -> Any:
            return page.locator(f"#schedule-{ids[key]}")

        def submit(target: Any) -> None:
            """Click a button or link and wait until the page it leads to (after the redirect) has
            loaded: a reload or a query while Chromium still swaps the page fails."""
            with page.expect_navigation(wait_until="load"):
                (page.locator(target) if isinstance(target, str) else target).click()

        try:
            # 1. sign in
            page.goto(url + "/")
            assert "/console/login" in page.url
            shot("01-sign-in")
            page.fill("#token", "not the token")
            submit("button[type=submit]")
            assert "not the service" in page.inner_text("#login")
            page.fill("#token", TOKEN)
            submit("button[type=submit]")
            page.wait_for_selector("#schedules")
            assert page.url.rstrip("/") == url
            assert page.inner_text("#health").lower().startswith("ok")
            assert "delivered today" in page.inner_text("#today")
            assert "At 09:00, Monday through Friday" in row("standup").inner_text()
            assert len(row("standup").locator("ol.runs li").all()) == 5
            shot("02-schedules")

            # 2. filter by agent and state
            page.fill("input[name=agent]", research)
            page.select_option("select[name=state]", "pending_approval")
            submit("#filters button[type=submit]")
            page.wait_for_selector("#schedules")
            assert row("poll").count() == 1 and row("inbox").count() == 0 and row("standup").count() == 0
            assert row("poll").get_attribute("data-state") == "pending_approval"
            shot("03-filter-pending")

            # 3. approve the pending schedule
            submit(row("poll").locator("button", has_text="Approve"))
            assert f"Approved schedule {ids['poll']}" in page.inner_text(".flash")
            assert state(core, ids["poll"]) == "active"  # (Playwright's loop runs here: the store read as is)
            shot("04-approved")

            # 4. pause
            page.goto(url + "/")
            submit(row("queue").locator("button", has_text="Pause"))
            assert f"Paused schedule {ids['queue']}" in page.inner_text(".flash")
            assert row("queue").get_attribute("data-state") == "paused"
            shot("05-paused")

            # 5. run now, then again: the schedule's max_per_day (1) holds the second back
            submit(row("inbox").locator("button", has_text="Run now"))
            assert "due now" in page.inner_text(".flash")

            def shows(outcome: str) -> bool:
                page.goto(url + "/", wait_until="load")
                dels = row("inbox").locator("ul.dels")
                return dels.count() > 0 and outcome in dels.inner_text()

            wait_for(lambda: shows("delivered"), "the run-now delivery on the page")
            assert re.search(r"run \S+", row("inbox").inner_text()), "the Letta run id is shown"
            shot("06-run-now")
            submit(row("inbox").locator("button", has_text="Run now"))
            wait_for(lambda: shows("over_budget"), "the over-budget row on the page")
            today = page.inner_text("#today")
            assert re.search(r"1\s+over budget today", today), today
            shot("07-over-budget")

            # 6. cancel, with its confirmation
            submit(row("cert").locator("a", has_text="Cancel"))
            page.wait_for_selector("#confirm-cancel")
            assert "America/New_York" in page.inner_text("main")
            shot("08-cancel-confirm")
            submit("#confirm-cancel button[type=submit]")
            assert f"Cancelled schedule {ids['cert']}" in page.inner_text(".flash")
            assert row("cert").count() == 0, "cancelled schedules leave the live list"
            assert state(core, ids["cert"]) == "cancelled"
            shot("09-cancelled")

            # 7. the agent view
            page.goto(url + "/console/agents")
            shot("10-agents")
            submit(f"a:text('{ops}')")
            page.wait_for_selector("#agent-usage")
            assert "Say hello to the team." in page.inner_text("main")
            shot("11-agent")

            # 8. the timeline (issue 32 point 6): from the agent's page, then every agent's
            submit("#timeline-link a")
            page.wait_for_selector("#runs-chart")
            assert page.locator("#runs-chart g.agent-row").count() == 1
            # the standup (09:00 Berlin, Monday to Friday) runs exactly 5 times in any 7 days; the
            # paused queue, the cancelled and the delivered one-time prompts are not drawn
            assert page.locator("#runs-chart rect.run").count() == 5
            page.goto(url + "/console/timeline")
            page.wait_for_selector("#runs-chart")
            assert page.locator("#runs-chart g.agent-row").count() == 2
            # research: the inbox every 4h (a mark per run) and the poll every 2m (5,040 runs: one band)
            research_row = page.locator(f"#runs-chart g.agent-row[data-agent='{research}']")
            assert research_row.locator("rect.band").count() == 1
            assert 30 <= research_row.locator("rect.run").count() <= 42
            bars = page.locator("#deliveries-chart rect.bar")
            assert bars.count() >= 2, "delivered and over_budget this hour"
            assert page.locator("#deliveries-chart rect.out-over_budget").count() == 1
            legend = page.locator("#deliveries-chart").text_content() or ""
            assert "over_budget (1)" in legend and re.search(r"delivered \([2-9]\)", legend), legend
            shot("12-timeline")
        finally:
            browser.close()
    assert sorted(p.name for p in shots.glob("*.png"))[:2] == ["01-sign-in.png", "02-schedules.png"]
