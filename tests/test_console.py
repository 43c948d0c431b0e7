"""The operator console (issue 22, points 1 and 2): every page and action behind the token (a sign-in
form, an HttpOnly SameSite=Strict session cookie, a CSRF token on every form that changes something),
and the actions through the core. The service's ASGI app in process (no delivery), a real SQLite file."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from promptyoself.core.operations import Core
from promptyoself.faces.console import SESSION_COOKIE, SESSION_SECONDS
from promptyoself.faces.http import build_service_app
from tests.helpers_delivery import make_settings

TOKEN = "s3cret-console-token"
AGENT = "agent-console-1"

GET_PAGES = ["/", "/console", "/console/agents", f"/console/agents/{AGENT}", "/console/schedules/1",
             "/console/schedules/1/cancel", "/console/nowhere"]
ACTIONS = ["pause", "resume", "run", "cancel", "approve", "reject"]


def make(db_path: Path, token: str | None, **overrides: object) -> tuple[Core, TestClient]:
    extra = {"http_token": token} if token else {}
    settings = make_settings(db_path, letta_base_url="http://127.0.0.1:9", **extra, **overrides)
    core = Core(settings)
    app = build_service_app(core, settings, delivery=False)
    return core, TestClient(app, base_url="http://127.0.0.1:8000", follow_redirects=False)


@pytest.fixture
def guarded(db_path: Path) -> Iterator[tuple[Core, TestClient]]:
    core, client = make(db_path, TOKEN)
    asyncio.run(core.scheduling.schedule_every("check the queue", "30m", agent_id=AGENT, skip_validation=True))
    yield core, client
    client.close()
    core.close()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([A-Za-z0-9_.-]+)"', html)
    assert found, "no CSRF token on the page"
    return found.group(1)


def sign_in(client: TestClient) -> str:
    r = client.post("/console/login", data={"token": TOKEN, "next": "/"})
    assert r.status_code == 303 and r.headers["location"] == "/"
    page = client.get("/")
    assert page.status_code == 200
    return csrf_of(page.text)


@pytest.mark.parametrize("path", GET_PAGES)
def test_every_page_needs_the_token(guarded: tuple[Core, TestClient], path: str) -> None:
    _, client = guarded
    r = client.get(path)
    assert r.status_code == 303 and r.headers["location"].startswith("/console/login?next=")
    assert "check the queue" not in r.text


@pytest.mark.parametrize("action", [*ACTIONS, "logout"])
def test_every_action_needs_the_token(guarded: tuple[Core, TestClient], action: str) -> None:
    core, client = guarded
    path = "/console/logout" if action == "logout" else f"/console/schedules/1/{action}"
    r = client.post(path, data={"csrf": "0" * 40, "confirm": "yes"})
    assert r.status_code == 401
    assert asyncio.run(core.operator.console_schedule(1))["schedule"]["state"] == "active"


@pytest.mark.parametrize("action", ACTIONS)
def test_every_action_needs_the_csrf_token(guarded: tuple[Core, TestClient], action: str) -> None:
    core, client = guarded
    good = sign_in(client)
    for data in ({"confirm": "yes"}, {"csrf": "f" * 40, "confirm": "yes"}):
        r = client.post(f"/console/schedules/1/{action}", data=data)
        assert r.status_code == 403 and "CSRF" in r.text
    r = client.post(f"/console/schedules/1/{action}", data={"csrf": good, "confirm": "yes"},
                    headers={"origin": "https://evil.example"})
    # refused before the console sees it (the service's RequestGuard), else by the console's own check
    assert r.status_code == 403 and ("forbidden_origin" in r.text or "Cross-site" in r.text)
    assert asyncio.run(core.operator.console_schedule(1))["schedule"]["state"] == "active"


def test_sign_in_sets_a_strict_httponly_cookie_and_never_the_token(guarded: tuple[Core, TestClient]) -> None:
    _, client = guarded
    r = client.get("/console/login?next=/console/agents")
    assert r.status_code == 200 and 'name="token"' in r.text and "check the queue" not in r.text
    bad = client.post("/console/login", data={"token": "wrong", "next": "/"})
    assert bad.status_code == 401 and "not the service" in bad.text and SESSION_COOKIE not in bad.cookies
    r = client.post("/console/login", data={"token": TOKEN, "next": "https://evil.example/"})
    assert r.status_code == 303 and r.headers["location"] == "/", "no open redirect"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=") and TOKEN not in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert f"Max-Age={SESSION_SECONDS}" in cookie and "Path=/" in cookie
    page = client.get("/")
    assert page.status_code == 200 and "check the queue" in page.text
    # a forged or tampered cookie is no session
    value = client.cookies.get(SESSION_COOKIE)
    assert value is not None
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, value[:-2] + ("00" if not value.endswith("00") else "11"))
    assert client.get("/").status_code == 303
    # signing out ends it
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, value)
    out = client.post("/console/logout", data={"csrf": csrf_of(page.text)})
    assert out.status_code == 303 and out.headers["location"] == "/console/login"
    assert client.get("/").status_code == 303


def test_bearer_token_works_for_scripts(guarded: tuple[Core, TestClient]) -> None:
    core, client = guarded
    auth = {"authorization": f"Bearer {TOKEN}"}
    assert client.get("/console/agents", headers=auth).status_code == 200
    r = client.post("/console/schedules/1/pause", headers=auth, data={})
    assert r.status_code == 303 and asyncio.run(core.operator.console_schedule(1))["schedule"]["state"] == "paused"
    assert client.get("/", headers={"authorization": "Bearer nope"}).status_code == 303


def test_the_rest_of_the_service_still_needs_the_bearer_token(guarded: tuple[Core, TestClient]) -> None:
    _, client = guarded
    sign_in(client)  # a console session is no bearer token for /metrics or the API
    assert client.get("/metrics").status_code == 401
    assert client.get("/healthz").status_code in (200, 503)


def test_actions_change_the_schedule_through_the_core(guarded: tuple[Core, TestClient]) -> None:
    core, client = guarded
    csrf = sign_in(client)

    def post(action: str, **extra: str) -> str:
        r = client.post(f"/console/schedules/1/{action}", data={"csrf": csrf, "back": "/?state=all", **extra})
        assert r.status_code == 303, r.text
        return str(r.headers["location"])

    assert post("pause") == "/?state=all"
    page = client.get("/?state=all")
    assert "Paused schedule 1." in page.text and 'data-state="paused"' in page.text
    assert "Paused schedule 1." not in client.get("/?state=all").text, "a notice shows once"
    post("resume")
    assert asyncio.run(core.operator.console_schedule(1))["schedule"]["state"] == "active"
    post("run")
    row = asyncio.run(core.operator.console_schedule(1))
    assert row["schedule"]["state"] == "active"
    # cancel asks first: without confirm=yes it leads to the confirmation page
    assert post("cancel").startswith("/console/schedules/1/cancel?back=")
    confirm = client.get("/console/schedules/1/cancel?back=/")
    assert confirm.status_code == 200 and "Yes, cancel schedule #1" in confirm.text
    assert asyncio.run(core.operator.console_schedule(1))["schedule"]["state"] == "active"
    post("cancel", confirm="yes")
    assert asyncio.run(core.operator.console_schedule(1))["schedule"]["state"] == "cancelled"
    # an action the schedule's state does not allow is reported, not a crash
    post("approve")
    assert "only schedules in state pending_approval" in client.get("/").text
    assert client.post("/console/schedules/1/explode", data={"csrf": csrf}).status_code == 404


@pytest.mark.slow
def test_pages_show_rule_runs_history_health_counters_and_guardrails(db_path: Path) -> None:
    core, client = make(db_path, TOKEN, approval_below="1h", max_deliveries_per_agent_per_day=7)
    try:
        made = asyncio.run(core.scheduling.schedule_cron("standup", "0 9 * * MON-FRI", agent_id=AGENT,
                                                         timezone="Europe/Berlin",
                                  skip_validation=True))
        pending = asyncio.run(core.scheduling.schedule_every("too often", "5m", agent_id="agent-other",
                                                             skip_validation=True))
        sign_in(client)
        page = client.get("/").text
        assert "At 09:00, Monday through Friday" in page and "Europe/Berlin" in page
        assert page.count('<li class="mono">') >= 5, "next 5 runs"
        assert "delivered today" in page and "over budget today" in page and "waiting for approval" in page
        assert 'id="health"' in page and "letta_unreachable" in page and "Fix:" in page
        assert "daily budget per agent <strong>7</strong>" in page and "approval below <strong>1h</strong>" in page
        filtered = client.get("/?" + "agent=agent-other&state=pending_approval").text
        assert f"schedule-{pending['id']}" in filtered and f"schedule-{made['id']}" not in filtered
        assert "Approve" in filtered and "Reject" in filtered
        agents = client.get("/console/agents").text
        assert AGENT in agents and "agent-other" in agents and "of 7" in agents
        agent = client.get(f"/console/agents/{AGENT}").text
        assert "standup" in agent and "too often" not in agent and "budget left today" in agent
        assert client.get(f"/console/schedules/{made['id']}").status_code == 200
        assert client.get("/console/schedules/999").status_code == 404
        assert client.get("/?state=bogus").status_code == 400
    finally:
        client.close()
        core.close()


def test_open_console_without_a_token_still_checks_csrf(db_path: Path) -> None:
    core, client = make(db_path, None)
    try:
        asyncio.run(core.scheduling.schedule_every("open", "30m", agent_id=AGENT, skip_validation=True))
        assert client.post("/console/schedules/1/pause", data={}).status_code == 403, "no session, no action"
        first = client.get("/")
        assert first.status_code == 200 and SESSION_COOKIE in first.cookies
        assert "HttpOnly" in first.headers["set-cookie"]
        assert client.get("/console/login").status_code == 303, "nothing to sign in to"
        assert client.post("/console/schedules/1/pause", data={"csrf": "0" * 40}).status_code == 403
        r = client.post("/console/schedules/1/pause", data={"csrf": csrf_of(first.text)})
        assert r.status_code == 303 and asyncio.run(core.operator.console_schedule(1))["schedule"]["state"] == "paused"
        r = client.post("/console/schedules/1/resume", data={"csrf": csrf_of(first.text)}, headers={"origin": "null"})
        assert r.status_code == 403
        # DNS rebinding: a page of another site whose name points at 127.0.0.1 reads nothing
        rebound = client.get("/", headers={"host": "attacker.example:8000"})
        assert rebound.status_code == 403 and "open" not in rebound.text and SESSION_COOKIE not in rebound.cookies
        assert client.get("/", headers={"host": "localhost:8000"}).status_code == 200
        assert client.get("/", headers={"host": "[::1]:8000"}).status_code == 200
    finally:
        client.close()
        core.close()
