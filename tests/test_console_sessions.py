"""Console sessions live in the database (issue 29 item 5): signing out holds across a restart and in
every process on the same database, sessions expire, and the operator can sign out everywhere. Links
back are same-site paths only (item 9). Wrong tokens are throttled per client across parallel
requests and across the console and the REST API (item 13). In process: two service apps on one real
SQLite file stand for a restart (TestClient)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from promptyoself.core.operations import Core
from promptyoself.faces.console import SESSION_COOKIE, local_path
from promptyoself.faces.http import build_service_app
from promptyoself.faces.http_auth import GuessLimiter
from tests.helpers_delivery import Clock, make_settings
from tests.pg import pg_url  # noqa: F401  (a fixture)

TOKEN = "s3cret-console-token"
AGENT = "agent-sessions"


class Instance:
    """One service process: a Core and its app on the shared database file."""

    def __init__(self, db: Path | str, clock: Clock | None = None) -> None:
        self.db = db
        settings = make_settings(db, letta_base_url="http://127.0.0.1:9", http_token=TOKEN)
        self.core = Core(settings, clock=clock) if clock else Core(settings)
        self.app = build_service_app(self.core, settings, delivery=False)
        self.client = TestClient(self.app, base_url="http://127.0.0.1:8000", follow_redirects=False)

    def close(self) -> None:
        self.client.close()
        self.core.close()


@pytest.fixture
def two(db_path: Path) -> Iterator[tuple[Instance, Instance]]:
    a = Instance(db_path)
    asyncio.run(a.core.scheduling.schedule_every("check the queue", "30m", agent_id=AGENT, skip_validation=True))
    b = Instance(db_path)
    yield a, b
    a.close()
    b.close()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([A-Za-z0-9_.-]+)"', html)
    assert found
    return found.group(1)


def sign_in(client: TestClient) -> tuple[str, str]:
    client.cookies.clear()
    r = client.post("/console/login", data={"token": TOKEN, "next": "/"})
    assert r.status_code == 303
    page = client.get("/")
    assert page.status_code == 200
    cookie = client.cookies.get(SESSION_COOKIE)
    assert cookie
    return cookie, csrf_of(page.text)


def use(client: TestClient, cookie: str) -> None:
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, cookie)


def test_signed_out_cookie_and_its_csrf_stay_dead_after_a_restart(two: tuple[Instance, Instance]) -> None:
    a, b = two
    cookie, csrf = sign_in(a.client)
    use(b.client, cookie)
    assert b.client.get("/").status_code == 200, "another process on the same database knows the session"
    assert a.client.post("/console/logout", data={"csrf": csrf}).status_code == 303
    a.close()
    restarted = Instance(a.db)
    try:
        for client in (b.client, restarted.client):
            use(client, cookie)
            assert client.get("/").status_code == 303, "signed out is signed out after a restart"
            r = client.post("/console/schedules/1/pause", data={"csrf": csrf})
            assert r.status_code == 401
        assert asyncio.run(restarted.core.operator.console_schedule(1))["schedule"]["state"] == "active"
        fresh, _ = sign_in(restarted.client)  # signing in again works
        assert fresh != cookie
    finally:
        restarted.close()


@pytest.mark.postgres
def test_sign_out_survives_a_restart_on_postgresql(pg_url: str) -> None:  # noqa: F811
    a = Instance(pg_url)
    asyncio.run(a.core.scheduling.schedule_every("check the queue", "30m", agent_id=AGENT, skip_validation=True))
    cookie, csrf = sign_in(a.client)
    assert a.client.post("/console/logout", data={"csrf": csrf}).status_code == 303
    a.close()
    b = Instance(pg_url)
    try:
        use(b.client, cookie)
        assert b.client.get("/").status_code == 303
        assert b.client.post("/console/schedules/1/pause", data={"csrf": csrf}).status_code == 401
    finally:
        b.close()


def test_sessions_expire_by_the_database_clock(db_path: Path) -> None:
    clock = Clock()
    one = Instance(db_path, clock)
    try:
        sign_in(one.client)
        clock.advance(hours=11, minutes=59)
        assert one.client.get("/").status_code == 200
        clock.advance(minutes=2)
        assert one.client.get("/").status_code == 303, "12 hours after signing in the session is over"
    finally:
        one.close()


def test_sign_out_everywhere_ends_every_session(two: tuple[Instance, Instance]) -> None:
    a, b = two
    cookie_a, csrf_a = sign_in(a.client)
    cookie_b, _ = sign_in(b.client)
    assert b.client.get("/").status_code == 200
    r = a.client.post("/console/logout-all", data={"csrf": csrf_a})
    assert r.status_code == 303 and r.headers["location"] == "/console/login"
    for client, cookie in ((a.client, cookie_a), (b.client, cookie_b)):
        use(client, cookie)
        assert client.get("/").status_code == 303
    # it needs the session's CSRF token like every other action
    cookie, _ = sign_in(a.client)
    assert a.client.post("/console/logout-all", data={"csrf": "x"}).status_code == 403
    assert a.client.get("/").status_code == 200


def test_the_session_table_holds_no_usable_cookie(two: tuple[Instance, Instance]) -> None:
    from sqlalchemy import text

    a, _ = two
    cookie, _ = sign_in(a.client)
    with a.core.store.engine.connect() as conn:
        rows = conn.execute(text("SELECT id_hash FROM console_sessions")).scalars().all()
    assert len(rows) == 1 and rows[0] not in cookie and len(rows[0]) == 64


# ---- item 9: links back are same-site paths -------------------------------------------------------

EVIL = ["//evil.example", "/\\evil.example", "\\\\evil.example", "/%09/evil.example", "/%2F/evil.example",
        "/%2f%2fevil.example", "/%5cevil.example", "/%252F/evil.example", "/\t/evil.example", "\t//evil.example",
        "/\n/evil.example", "/%0a/evil.example", "/%0d%0a/evil.example", " //evil.example", "http://evil.example",
        "https:evil.example", "javascript:alert(1)", "JaVaScRiPt:alert(1)", "data:text/html,x", "evil.example",
        "/\u3000/evil.example", "/%e3%80%80/evil.example", "/%C2%A0/evil.example", "///evil.example",
        "/ /evil.example", "", "/" + "a" * 3000]
GOOD = ["/", "/?state=all", "/console/agents", "/console/agents/agent-1", "/console/schedules/7?x=1&y=%2B"]


@pytest.fixture
def one(db_path: Path) -> Iterator[Instance]:
    a = Instance(db_path)
    asyncio.run(a.core.scheduling.schedule_every("check the queue", "30m", agent_id=AGENT, skip_validation=True))
    yield a
    a.close()


@pytest.mark.parametrize("target", EVIL)
def test_back_and_next_refuse_every_other_site(one: Instance, target: str) -> None:
    a = one
    assert local_path(target) == "/"
    sign_in(a.client)
    page = a.client.get("/console/schedules/1/cancel", params={"back": target})
    assert page.status_code == 200
    assert re.search(r'<a class="button" href="/">No, keep it</a>', page.text), "the link falls back to /"
    assert "evil" not in page.text
    csrf = csrf_of(page.text)
    after = a.client.post("/console/schedules/1/pause", data={"csrf": csrf, "back": target})
    assert after.status_code == 303 and after.headers["location"] == "/", "the redirect after an action too"
    a.client.cookies.clear()
    login = a.client.post("/console/login", data={"token": TOKEN, "next": target})
    assert login.status_code == 303 and login.headers["location"] == "/", "and after signing in"


@pytest.mark.parametrize("target", GOOD)
def test_back_keeps_this_sites_paths(target: str) -> None:
    assert local_path(target) == target


# ---- item 13: wrong tokens are throttled per client, on every face together -----------------------


def test_limiter_allows_five_failed_checks_a_second_and_refunds_right_ones() -> None:
    now = [100.0]
    limiter = GuessLimiter(clock=lambda: now[0])
    assert [limiter.take("x") for _ in range(7)] == [True] * 5 + [False] * 2
    assert limiter.take("y"), "another client has its own budget"
    now[0] += 0.2
    assert limiter.take("x") and not limiter.take("x"), "one more check per 1/5 s"
    for _ in range(50):  # right tokens cost nothing
        assert limiter.take("z")
        limiter.give_back("z")


def test_parallel_wrong_tokens_are_throttled_across_rest_and_console(db_path: Path) -> None:
    settings = make_settings(db_path, letta_base_url="http://127.0.0.1:9", http_token=TOKEN)
    core = Core(settings)
    app = build_service_app(core, settings, delivery=False)
    app.guesses.clock = lambda: 500.0  # a frozen clock: no refill during the burst

    async def burst() -> list[int]:
        transport = httpx.ASGITransport(app=app, client=("10.0.0.7", 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
            rest = [http.get("/api/schedules", headers={"authorization": f"Bearer guess-{i}"}) for i in range(20)]
            console = [http.post("/console/login", data={"token": f"guess-{i}", "next": "/"}) for i in range(10)]
            answers = await asyncio.gather(*rest, *console)
            right = await http.get("/api/schedules", headers={"authorization": f"Bearer {TOKEN}"})
        return [r.status_code for r in answers] + [right.status_code]

    try:
        codes = asyncio.run(burst())
    finally:
        core.close()
    wrong, last = codes[:-1], codes[-1]
    assert sum(c in (401,) for c in wrong) == 5, codes
    assert sum(c == 429 for c in wrong) == 25, codes
    assert last == 429, "even the right token waits while the bucket is empty (its check would be a guess)"


# ---- item 13: created_last_hour is the count ---------------------------------------------------------


def test_created_last_hour_is_the_count_even_past_the_limit(db_path: Path) -> None:
    """Five schedules made in the hour (before the limit of 2 was set, or through a race) show as 5,
    not as the limit."""
    core = Core(make_settings(db_path, letta_base_url="http://127.0.0.1:9", max_schedules_per_agent_per_hour=0))
    try:
        for i in range(5):
            asyncio.run(core.scheduling.schedule_every(f"p{i}", "30m", agent_id=AGENT, skip_validation=True))
        asyncio.run(core.operator.policy_set({"max_schedules_per_agent_per_hour": 2}))
        usage = asyncio.run(core.operator.agent_usage(AGENT))
        assert usage["created_last_hour"] == 5 and usage["hourly_limit"] == 2
    finally:
        core.close()
