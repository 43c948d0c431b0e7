"""The overlap policy end to end (issue 43 point 3), from an empty database through the real entry
points, against targets kept busy on purpose: the fake Letta holds every run ``running`` (its
``run_status``) until the test lets them finish. ``skip`` through the CLI (``schedule --overlap``,
``execute``, ``history``); ``queue`` through a worker process (it waits, recorded once, and is sent
when the run finishes, the runs that came due meanwhile skipped); ``allow`` sent anyway; and a target
that cannot tell (a webhook), scheduled through REST and MCP with ``queue``, says so and is sent as
``allow``. The engine's logic is in ``tests/test_overlap.py`` (fast tier)."""

from __future__ import annotations

import base64
import json
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from fastmcp import Client

from promptyoself.core.operations import Core
from promptyoself.faces.mcp import build_server
from promptyoself.faces.rest import build_rest_app
from testkit.fake_letta import FakeLetta
from testkit.webhook_receiver import WebhookReceiver
from tests.conftest import make_settings
from tests.helpers_delivery import CLI, Proc, cli_env, cli_json, kill_all, wait_until

pytestmark = pytest.mark.slow

SECRET = "whsec_" + base64.b64encode(b"the-secret-of-the-overlap-tests!").decode()
EVERY = 2  # seconds between two runs of the schedules here


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "overlap.db"
    yield path
    kill_all(path)


def env_for(db: Path, **extra: str) -> dict[str, str]:
    return cli_env(db, PROMPTYOSELF_MIN_INTERVAL="1s", **extra)


def schedule(env: dict[str, str], agent: str, *extra: str) -> dict[str, Any]:
    return cli_json(env, "schedule", "--skip-validation", "--prompt", "Check the queue", "--every", f"{EVERY}s",
               "--agent-id", agent, *extra)


def listed(env: dict[str, str], sid: int) -> dict[str, Any]:
    return next(s for s in cli_json(env, "list")["schedules"] if s["id"] == sid)


def outcomes(env: dict[str, str], sid: int) -> list[str]:
    return [d["outcome"] for d in reversed(rows(env, sid))]


def rows(env: dict[str, str], sid: int) -> list[dict[str, Any]]:
    """The schedule's history, newest first, without the ``missed`` rows: runs that came due while a
    CLI process started (seconds) are coalesced into the next one (catch_up=latest), as any late run."""
    found = cli_json(env, "history", "--schedule-id", str(sid), "--limit", "200")["deliveries"]
    return [d for d in found if d["outcome"] != "missed"]


def wait_past(instant: str) -> None:
    """Sleep until the wall clock has passed ``instant`` (an ISO time from ``list``)."""
    left = (datetime.fromisoformat(instant) - datetime.now(UTC)).total_seconds()
    if left > -0.2:
        time.sleep(left + 0.3)


def execute_when_due(env: dict[str, str], sid: int) -> list[str]:
    """Wait for the schedule's next run, then ``execute``: what happened to it."""
    wait_past(listed(env, sid)["next_run"])
    return [e["outcome"] for e in cli_json(env, "execute")["executed"] if e["id"] == sid]


def test_skip_records_the_run_skipped_while_the_letta_run_still_runs(db: Path) -> None:
    with FakeLetta(agents=1, run_status="running") as fake:
        env = env_for(db, LETTA_BASE_URL=fake.url)
        made = schedule(env, fake.agent_ids[0], "--overlap", "skip")
        sid = int(made["id"])
        assert made["overlap"] == "skip" and "cannot tell" not in made["description"]
        assert execute_when_due(env, sid) == ["delivered"]  # nothing ran before: sent
        assert execute_when_due(env, sid) == ["skipped"]  # its run still runs: skipped, not sent
        row = listed(env, sid)
        assert row["overlap"] == "skip" and row["state"] == "active"
        assert row["last_error"].startswith("skipped: a turn is still running at the letta target (run run-")
        assert len(fake.received) == 1
        fake.configure(run_status="completed")  # the turn ends: the next run is sent
        assert execute_when_due(env, sid) == ["delivered"]
        assert len(fake.received) == 2
        history = rows(env, sid)
    assert [d["outcome"] for d in reversed(history)] == ["delivered", "skipped", "delivered"]
    skipped = history[1]
    assert "overlap=skip" in skipped["error"] and skipped["receipt"] is None


def test_queue_waits_in_a_worker_until_the_run_ends_and_skips_what_came_due(db: Path) -> None:
    with FakeLetta(agents=1, run_status="running") as fake:
        env = env_for(db, LETTA_BASE_URL=fake.url)
        sid = int(schedule(env, fake.agent_ids[0], "--overlap", "queue")["id"])
        w = Proc([*CLI, "worker", "--shared"], {**env, "PROMPTYOSELF_EXECUTOR_INTERVAL": "0.2",
                                                "PROMPTYOSELF_OVERLAP_POLL": "0.3"})
        try:
            wait_until(lambda: outcomes(env, sid) == ["delivered", "queued"], timeout=60)
            waiting = listed(env, sid)
            assert waiting["last_error"].startswith("queued: a turn is still running at the letta target")
            slot = waiting["next_run"]
            # two more runs come due while it waits: it keeps its slot, asked again and again, recorded once
            wait_past((datetime.fromisoformat(slot) + timedelta(seconds=2 * EVERY)).isoformat())
            assert outcomes(env, sid) == ["delivered", "queued"] and len(fake.received) == 1
            assert listed(env, sid)["next_run"] == slot
            fake.configure(run_status="completed")  # the run ends: the waiting one is sent
            wait_until(lambda: outcomes(env, sid).count("delivered") >= 2, timeout=60)
        finally:
            w.popen.send_signal(signal.SIGTERM)
            w.popen.wait(timeout=30)
        history = list(reversed(rows(env, sid)))
    assert [d["outcome"] for d in history[:4]] == ["delivered", "queued", "delivered", "skipped"]
    assert history[2]["scheduled_for"] == slot  # the one that waited is the one sent
    assert all("at most one waits" in d["error"] for d in history[3:] if d["outcome"] == "skipped")
    assert {d["outcome"] for d in history[4:]} <= {"skipped", "delivered", "queued"}


def test_allow_sends_while_the_run_still_runs(db: Path) -> None:
    with FakeLetta(agents=1, run_status="running") as fake:
        env = env_for(db, LETTA_BASE_URL=fake.url)
        sid = int(schedule(env, fake.agent_ids[0], "--overlap", "allow")["id"])
        assert execute_when_due(env, sid) == ["delivered"]
        assert execute_when_due(env, sid) == ["delivered"]
        assert len(fake.received) == 2 and listed(env, sid)["overlap"] == "allow"


async def test_a_webhook_cannot_tell_so_queue_is_sent_as_allow_and_says_so(db: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Made through REST and MCP with overlap=queue; the webhook target has no busy check: the
    schedules say so and every run is delivered (``execute``)."""
    with WebhookReceiver(SECRET) as rx:
        hook = {"PROMPTYOSELF_WEBHOOK_URL": rx.url, "PROMPTYOSELF_WEBHOOK_SECRET": SECRET}
        for name, value in hook.items():
            monkeypatch.setenv(name, value)
        core = Core(make_settings(db, http_token="overlap-token", min_interval="1s"))
        try:
            with TestClient(build_rest_app(core), headers={"Authorization": "Bearer overlap-token"}) as rest:
                made = rest.post("/api/schedules/every", json={"prompt": "deploy", "every": f"{EVERY}s",
                                                               "agent_id": "deploy-bot", "target": "webhook",
                                                               "overlap": "queue"})
                assert made.status_code == 200, made.text
                bad = rest.post("/api/schedules/every", json={"prompt": "x", "every": "1h", "agent_id": "deploy-bot",
                                                              "target": "webhook", "overlap": "sometimes"})
                assert bad.status_code in (400, 422) and "overlap" in bad.text
            async with Client(build_server(core)) as client:
                answer = await client.call_tool("promptyoself_schedule_every", {
                    "prompt": "deploy again", "every": "1h", "agent_id": "deploy-bot", "target": "webhook",
                    "overlap": "skip"})
                by_mcp = json.loads(answer.content[0].text)
        finally:
            core.close()
        by_rest = made.json()
        note = "but the webhook target cannot tell whether a turn is still running: sent anyway (as allow)"
        assert by_rest["overlap"] == "queue" and f"overlap=queue asked, {note}" in by_rest["description"]
        assert by_mcp["overlap"] == "skip" and f"overlap=skip asked, {note}" in by_mcp["description"]
        env = env_for(db, **hook)
        sid = int(by_rest["id"])
        assert listed(env, sid)["overlap"] == "queue" and note in listed(env, sid)["description"]
        assert execute_when_due(env, sid) == ["delivered"]
        assert execute_when_due(env, sid) == ["delivered"]
        assert outcomes(env, sid) == ["delivered", "delivered"] and len(rx.received) == 2
