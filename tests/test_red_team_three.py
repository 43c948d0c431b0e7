"""Issue 42 (red team, round three), items 3, 5, 7, 8, 9, 11, 14 and 6, each reproduced in process
(the ASGI app, httpx MockTransport, a real SQLite file in tmp_path) against the code before its fix."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from promptyoself.core.operations import Core
from promptyoself.faces.http import build_service_app
from tests.helpers_delivery import make_settings

TOKEN = "red-team-three-token-0123456789"
H = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}


# ---- item 3: X-Forwarded-For must not give each guess a fresh throttle bucket ------------------------


class _Sock:
    """What ``run_service`` reads of its socket: the address it is bound to (nothing listens)."""

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", 8000)


def _served_app(monkeypatch: pytest.MonkeyPatch, db_path: Path, **overrides: Any) -> tuple[Core, Any]:
    """The ASGI app exactly as ``promptyoself serve`` hands it to uvicorn (uvicorn's own wrappers, such
    as its proxy-headers middleware, included): ``run_service`` with ``uvicorn.Server.run`` replaced by
    taking its config."""
    import uvicorn

    from promptyoself.faces import http
    from promptyoself.faces.http import run_service
    from promptyoself.faces.http_auth import GuessLimiter

    taken: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: taken.append(self.config))
    # the wrong-token throttle on a clock that stands still: what it allows does not depend on how fast
    # this machine answers the guesses (at 5 a second, a slow run refilled the bucket: no 429)
    monkeypatch.setattr(http, "GuessLimiter", lambda: GuessLimiter(clock=lambda: 1000.0))
    settings = make_settings(db_path, letta_base_url="http://127.0.0.1:9", http_token=TOKEN,
                             executor_autostart=False, **overrides)
    core = Core(settings)
    run_service(core, settings, sock=_Sock(), mcp_path=None)  # type: ignore[arg-type]
    config = taken[0]
    config.load()
    return core, config.loaded_app


def _guesses(app: Any, forwarded: bool) -> list[int]:
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))

    async def run() -> list[int]:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
            codes = []
            for i in range(30):
                headers = {"authorization": f"Bearer wrong-{i}"}
                if forwarded:
                    headers["x-forwarded-for"] = f"10.0.{i // 250}.{i % 250 + 1}"
                codes.append((await c.get("/api/schedules", headers=headers)).status_code)
            return codes

    import asyncio

    return asyncio.run(run())


def test_forwarded_for_from_loopback_does_not_reset_the_wrong_token_throttle(
        monkeypatch: pytest.MonkeyPatch, db_path: Path) -> None:
    core, app = _served_app(monkeypatch, db_path)
    try:
        codes = _guesses(app, forwarded=True)
    finally:
        core.close()
    assert 429 in codes, codes  # 30 guesses at once from one peer: throttled whatever header each names
    assert codes.count(401) <= 6, codes


def test_a_trusted_proxy_names_the_client(monkeypatch: pytest.MonkeyPatch, db_path: Path) -> None:
    core, app = _served_app(monkeypatch, db_path, trusted_proxies="127.0.0.1, 10.9.0.0/16")
    try:
        codes = _guesses(app, forwarded=True)
    finally:
        core.close()
    assert codes == [401] * 30, codes  # each forwarded client has its own allowance behind the proxy


def test_trusted_proxies_setting_takes_addresses_and_networks_only() -> None:
    from promptyoself.config import Settings

    assert Settings(trusted_proxies=" 127.0.0.1 ,::1, 10.0.0.0/8").trusted_proxies == "127.0.0.1,::1,10.0.0.0/8"
    assert Settings(trusted_proxies="").trusted_proxies is None
    with pytest.raises(ValueError):
        Settings(trusted_proxies="proxy.example")


# ---- item 5: answer bodies are read with a size bound -------------------------------------------------


class _Endless:
    """An answer body of up to ``chunks`` x 64 KiB that counts how much of it was read."""

    def __init__(self, chunks: int = 1000) -> None:
        self.chunks = chunks
        self.taken = 0

    async def __aiter__(self) -> Any:
        for _ in range(self.chunks):
            self.taken += 1
            yield b"x" * 65536


@pytest.mark.parametrize("status", [200, 503, 400])
async def test_a_huge_webhook_answer_is_not_read_whole(status: int) -> None:
    import base64

    from promptyoself.config import Settings
    from promptyoself.errors import PromptYoSelfError
    from promptyoself.targets.webhook.settings import WebhookEndpoint
    from promptyoself.targets.webhook.target import WebhookTarget
    from tests.test_webhook_target import occ, yes

    body = _Endless()
    ep = WebhookEndpoint("default", "https://hooks.example/in", ("whsec_" + base64.b64encode(b"k" * 24).decode(),))
    tgt = WebhookTarget(Settings(letta_timeout=5), endpoints={"default": ep},
                        transport=httpx.MockTransport(lambda r: httpx.Response(status, content=body)))
    try:
        sent = await tgt.send(occ(), yes)
    except PromptYoSelfError as exc:
        assert status != 200 and exc.details["http_status"] == status
    else:
        assert status == 200 and sent.details["http_status"] == 200
    finally:
        await tgt.aclose()
    assert body.taken <= 2, f"{body.taken} chunks of 64 KiB read of an answer whose status was all that counted"


class _EndlessSync:
    def __init__(self, chunks: int = 1000) -> None:
        self.chunks = chunks
        self.taken = 0

    def __iter__(self) -> Any:
        for _ in range(self.chunks):
            self.taken += 1
            yield b"x" * 65536


def test_a_huge_letta_answer_fails_the_blocking_call_unread() -> None:
    from promptyoself.letta.client import MAX_ANSWER_BYTES, LettaClient
    from promptyoself.letta.errors import LettaUnavailable

    body = _EndlessSync()
    client = LettaClient("http://letta.test",
                         transport=httpx.MockTransport(lambda r: httpx.Response(200, content=body)))
    with pytest.raises(LettaUnavailable, match="more than"):
        client.health()
    assert body.taken * 65536 <= MAX_ANSWER_BYTES + 65536


async def test_a_huge_letta_answer_fails_the_async_call_unread() -> None:
    from promptyoself.letta.client import MAX_ANSWER_BYTES, AsyncLettaClient
    from promptyoself.letta.errors import LettaUnavailable

    body = _Endless()
    client = AsyncLettaClient("http://letta.test",
                              transport=httpx.MockTransport(lambda r: httpx.Response(200, content=body)))
    with pytest.raises(LettaUnavailable, match="more than"):
        await client.list_agents()
    assert body.taken * 65536 <= MAX_ANSWER_BYTES + 65536


@pytest.mark.slow
async def test_an_endless_letta_answer_over_a_real_socket_is_cut() -> None:
    """aiohttp, as the delivery engine uses it, against a server that sends a chunked answer for ever."""
    import asyncio

    from promptyoself.letta.client import AsyncLettaClient
    from promptyoself.letta.errors import LettaUnavailable

    sent = 0

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        try:
            while sent < 200 * 1024 * 1024:  # 200 MB at most, should the client read on
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
                sent += len(chunk)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(endless, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = AsyncLettaClient(f"http://127.0.0.1:{port}", timeout=30)
    try:
        with pytest.raises(LettaUnavailable, match="more than"):
            await client.list_agents()
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    assert sent < 64 * 1024 * 1024, sent


# ---- item 7: a webhook URL's path and query are never shown -------------------------------------------

HOOK_PATH = "/services/T0001/B0001/s3cr3tPathXYZ"
HOOK_URL = f"http://127.0.0.1:9{HOOK_PATH}?token=q5ecret"


@pytest.fixture
def hook_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import base64

    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_URL", HOOK_URL)
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_SECRET", "whsec_" + base64.b64encode(b"k" * 24).decode())


def test_redact_endpoint_keeps_scheme_host_and_port_only() -> None:
    from promptyoself.config import redact_endpoint

    assert redact_endpoint(HOOK_URL) == "http://127.0.0.1:9/***"
    assert redact_endpoint("https://u:pw@hooks.example/x?y=1#z") == "https://hooks.example/***"
    assert redact_endpoint("https://[::1]:8443") == "https://[::1]:8443"
    assert redact_endpoint("https://hooks.example/") == "https://hooks.example"
    assert redact_endpoint("not a url") == "***"


async def test_webhook_errors_and_readiness_hide_the_path(hook_env: None) -> None:
    from promptyoself.config import Settings
    from promptyoself.errors import PromptYoSelfError
    from promptyoself.targets.webhook.target import WebhookTarget
    from tests.test_webhook_target import occ, yes

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    tgt = WebhookTarget(Settings(), transport=httpx.MockTransport(refuse))
    with pytest.raises(PromptYoSelfError) as caught:
        await tgt.send(occ(), yes)
    with pytest.raises(PromptYoSelfError) as probed:
        await tgt.probe()
    await tgt.aclose()
    for shown in (caught.value.message, probed.value.message, tgt.readiness(), str(caught.value.to_dict())):
        assert "s3cr3t" not in shown and "q5ecret" not in shown and "services" not in shown, shown
        assert "http://127.0.0.1:9/***" in shown, shown


def test_healthz_and_logs_hide_the_webhook_path(hook_env: None, db_path: Path) -> None:
    from starlette.testclient import TestClient

    from promptyoself.logs import Redactor

    settings = make_settings(db_path, letta_base_url="http://127.0.0.1:9", http_token=TOKEN)
    core = Core(settings)
    asyncio.run(core.scheduling.schedule_every("ping", "1h", agent_id="agent-hook", target="webhook",
                                               skip_validation=True))
    try:
        c = TestClient(build_service_app(core, settings, delivery=False), base_url="http://127.0.0.1:8000")
        for path in ("/healthz", "/readyz"):
            text = c.get(path).text
            assert "s3cr3t" not in text and "q5ecret" not in text, (path, text)
        assert "127.0.0.1:9/***" in c.get("/healthz").text
        redact = Redactor(settings)
        stored = redact(f"POST {HOOK_URL} failed; path {HOOK_PATH}; decoded {HOOK_PATH.strip('/')}")
        assert stored is not None and "s3cr3t" not in stored and "q5ecret" not in stored, stored
    finally:
        core.close()


# ---- item 8: nothing about the operator token on /healthz ----------------------------------------------


@pytest.mark.slow  # the delivery engine runs (its threads) and the test waits for its lease
def test_healthz_shows_nothing_of_the_operator_token(db_path: Path) -> None:
    import hashlib
    import time

    from starlette.testclient import TestClient

    settings = make_settings(db_path, letta_base_url="http://127.0.0.1:9", http_token=TOKEN,
                             executor_autostart=True, stdio_relay="off")
    core = Core(settings)
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    try:
        with TestClient(build_service_app(core, settings, delivery=True), base_url="http://127.0.0.1:8000") as c:
            for _ in range(100):  # the engine takes the lease (and records its token print) as it starts
                body = c.get("/healthz").json()
                if (body.get("worker") or {}).get("alive"):
                    break
                time.sleep(0.05)
            text = json.dumps(body)
        assert body["worker"]["alive"], body
        assert digest[:6] not in text and '"token"' not in text and "sha256" not in text, text
    finally:
        core.close()


# ---- item 9: serve refuses to run under an agent token -------------------------------------------------


@pytest.mark.parametrize("transport", [[], ["--transport", "http"], ["--transport", "sse"]])
def test_serve_refuses_an_agent_token(transport: list[str], db_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from promptyoself.faces.cli import main

    monkeypatch.setenv("PROMPTYOSELF_DB", str(db_path))
    monkeypatch.setenv("PROMPTYOSELF_AGENT_TOKEN", "pys_agent_not-the-operator")
    monkeypatch.setenv("PROMPTYOSELF_EXECUTOR_AUTOSTART", "false")
    code = main(["serve", "--port", "0", *transport])  # refused before any port is bound (fast tier: none may be)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "PROMPTYOSELF_AGENT_TOKEN" in err and "operator" in err and "pys_agent_not" not in err
    assert not db_path.exists(), "refused before the database was opened"


# ---- item 14: one spelling per id; a spaced-out secret is still redacted --------------------------------

ODD_IDS = ["12.0", "%2012", "%2012%20", "0012", "1_2", "%2B12", "12%0A", "１２"]


@pytest.fixture
def twelve(db_path: Path) -> Iterator[tuple[Core, Any]]:
    from starlette.testclient import TestClient

    settings = make_settings(db_path, letta_base_url="http://127.0.0.1:9", http_token=TOKEN)
    core = Core(settings)
    for i in range(12):
        asyncio.run(core.scheduling.schedule_every(f"prompt {i}", "1h", agent_id="agent-ids", skip_validation=True))
    c = TestClient(build_service_app(core, settings, delivery=False), base_url="http://127.0.0.1:8000",
                   raise_server_exceptions=False)
    yield core, c
    c.close()
    core.close()


def _state(core: Core, sid: int) -> str:
    from promptyoself.store import schedules

    row = schedules.get(core.store, sid)
    assert row is not None
    return str(row.state)


@pytest.mark.parametrize("odd", ODD_IDS)
def test_rest_ids_have_one_spelling(twelve: tuple[Core, Any], odd: str) -> None:
    core, c = twelve
    assert c.post("/api/schedules/12/pause", headers=H).status_code == 200  # the canonical one works
    assert c.post("/api/schedules/12/resume", headers=H).status_code == 200
    for method, path in (("POST", f"/api/schedules/{odd}/pause"), ("POST", f"/api/schedules/{odd}/resume"),
                         ("DELETE", f"/api/schedules/{odd}"), ("GET", f"/api/history?schedule_id={odd}")):
        r = c.request(method, path, headers=H)
        assert r.status_code == 422 and r.json()["code"] == "invalid_argument", (method, path, r.status_code, r.text)
    for method in ("GET", "DELETE"):
        r = c.request(method, f"/v1/agents/agent-ids/schedule/{odd}", headers=H)
        assert r.status_code == 404, (method, odd, r.status_code, r.text)
    assert _state(core, 12) == "active"


@pytest.mark.parametrize("odd", ["12.0", " 12", "12 ", "0012", "1_2", "+12", "１２", "12\n"])
def test_the_core_id_check_takes_canonical_text_only(odd: str) -> None:
    from promptyoself.core.checks import parse_schedule_id
    from promptyoself.errors import InvalidArgument

    assert parse_schedule_id("12") == 12 and parse_schedule_id(12) == 12
    with pytest.raises(InvalidArgument):
        parse_schedule_id(odd)


def test_a_spaced_out_secret_in_a_stored_error_is_redacted(db_path: Path) -> None:
    from promptyoself.logs import Redactor

    key = "sk-live-0123456789abcdef"
    redact = Redactor(make_settings(db_path, letta_api_key=key))
    for copy in (" ".join(key), "sk-live-0123 4567 89ab cdef", "\t".join(key.upper()), key):
        stored = redact(f"Letta said: key {copy} was refused")
        assert stored is not None
        squashed = "".join(stored.split()).lower()
        assert "0123456789abcdef" not in squashed and "789abc" not in squashed, stored
    assert redact("nothing secret here: s k 1 2") == "nothing secret here: s k 1 2"


# ---- item 11: an agent token cannot have Letta fetch a URL ----------------------------------------------


def _letta_body(**extra: Any) -> dict[str, Any]:
    import time

    return {"schedule": {"type": "one-time", "scheduled_at": int(time.time() * 1000) + 3_600_000},
            "messages": [{"role": "user", "content": "hi"}], **extra}


def test_an_agent_token_cannot_pass_a_callback_url(twelve: tuple[Core, Any]) -> None:
    from promptyoself.core import agent_tokens
    from promptyoself.store import schedules

    core, c = twelve
    token = asyncio.run(agent_tokens.mint(core, "agent-ids"))["token"]
    mine = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    before = len(schedules.letta_page(core.store, "agent-ids", None, 100))
    for url in ("http://169.254.169.254/latest/meta-data/", "https://example.org/hook"):
        r = c.post("/v1/agents/agent-ids/schedule", json=_letta_body(callback_url=url), headers=mine)
        assert r.status_code == 403 and r.json()["code"] == "forbidden" and "callback_url" in r.json()["error"], r.text
    assert len(schedules.letta_page(core.store, "agent-ids", None, 100)) == before, "nothing stored"
    # Without it the agent's request goes on (to the agent check on Letta, which is down here: 503), and
    # the operator may set one.
    assert c.post("/v1/agents/agent-ids/schedule", json=_letta_body(), headers=mine).status_code == 503
    r = c.post("/v1/agents/agent-ids/schedule", json=_letta_body(callback_url="https://example.org/hook"), headers=H)
    assert r.status_code == 503 and r.json()["code"] != "forbidden", r.text


# ---- item 6: an agent token cannot fill the disk ---------------------------------------------------------


def test_image_data_counts_against_the_stored_payload_limit(twelve: tuple[Core, Any]) -> None:
    from promptyoself.core import agent_tokens
    from promptyoself.store import schedules

    core, c = twelve
    token = asyncio.run(agent_tokens.mint(core, "agent-ids"))["token"]
    mine = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 300_000}}
    body = _letta_body()
    body["messages"] = [{"role": "user", "content": [{"type": "text", "text": "look"}, image]}]
    r = c.post("/v1/agents/agent-ids/schedule", json=body, headers=mine)
    assert r.status_code == 413 and "PROMPTYOSELF_MAX_PAYLOAD_BYTES" in r.json()["error"], r.text
    assert schedules.letta_page(core.store, "agent-ids", None, 100) == []


def _cancelled_with_history(core: Core, n: int) -> list[int]:
    from datetime import UTC, datetime

    from promptyoself.store.db import Delivery

    ids = []
    for i in range(n):
        sid = asyncio.run(core.scheduling.schedule_every(f"fill {i}", "1h", agent_id="agent-fill",
                                                         skip_validation=True))["id"]
        asyncio.run(core.scheduling.cancel(sid))
        ids.append(sid)
    with core.store.session() as s:
        now = datetime.now(UTC)
        for sid in ids:
            s.add(Delivery(schedule_id=sid, agent_id="agent-fill", scheduled_for=now, attempted_at=now,
                           outcome="delivered", attempt=1))
    return ids


def test_retention_purges_ended_schedules_and_old_history(db_path: Path) -> None:
    from datetime import timedelta

    from promptyoself.core.retention import purge
    from promptyoself.store import schedules
    from promptyoself.store.history import deliveries

    core = Core(make_settings(db_path))
    try:
        gone = _cancelled_with_history(core, 3)
        kept = asyncio.run(core.scheduling.schedule_every("still here", "1h", agent_id="agent-fill",
                                                          skip_validation=True))["id"]
        now = core.now()
        assert asyncio.run(purge(core, now=now))["schedules"] == 0, "nothing ended 7 days ago yet"
        later = now + timedelta(days=8)  # PROMPTYOSELF_KEEP_ENDED (7d) has passed for the cancelled ones
        done = asyncio.run(purge(core, now=later))
        assert done["schedules"] == 3 and done["history"] == 3, done
        assert all(schedules.get(core.store, sid) is None for sid in gone)
        assert schedules.get(core.store, kept) is not None
        assert deliveries(core.store, schedule_id=None, agent_id=None, limit=10) == []
    finally:
        core.close()


def test_retention_off_keeps_everything(db_path: Path) -> None:
    from datetime import timedelta

    from promptyoself.core.retention import purge

    core = Core(make_settings(db_path, keep_ended="off", keep_history="off"))
    try:
        _cancelled_with_history(core, 2)
        assert asyncio.run(purge(core, now=core.now() + timedelta(days=400)))["schedules"] == 0
    finally:
        core.close()


def test_the_purge_command(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from promptyoself.faces.cli import main

    core = Core(make_settings(db_path))
    try:
        _cancelled_with_history(core, 2)
        assert main(["purge", "--json"], core=core) == 0
        assert json.loads(capsys.readouterr().out)["schedules"] == 0  # ended just now: within 7 days
        assert main(["purge", "--before", "2999-01-01", "--json"], core=core) != 0  # the future: refused
        capsys.readouterr()
        future = core.now().isoformat()  # everything so far ended before it
        assert main(["purge", "--before", future, "--json"], core=core) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["schedules"] == 2 and out["history"] == 2, out
    finally:
        core.close()


def test_a_full_database_is_503_not_internal(db_path: Path) -> None:
    """SQLite's SQLITE_FULL ("database or disk is full", here from max_page_count, as from a full disk)."""
    from sqlalchemy import event, text
    from starlette.testclient import TestClient

    settings = make_settings(db_path, letta_base_url="http://127.0.0.1:9", http_token=TOKEN)
    core = Core(settings)
    try:
        with core.store.engine.connect() as conn:
            pages = int(conn.execute(text("PRAGMA page_count")).scalar() or 0)
        core.store.engine.dispose()
        event.listen(core.store.engine, "connect",
                     lambda dbapi, _rec: dbapi.execute(f"PRAGMA max_page_count={pages + 2}"))
        c = TestClient(build_service_app(core, settings, delivery=False), base_url="http://127.0.0.1:8000",
                       raise_server_exceptions=False)
        body = {"prompt": "x" * 7000, "every": "1h", "agent_id": "agent-full", "skip_validation": True}
        codes = [c.post("/api/schedules/every", json=body, headers=H) for _ in range(20)]
        failed = [r for r in codes if r.status_code != 200]
        assert failed, "the database never filled"
        assert failed[0].status_code == 503 and failed[0].json()["code"] == "database_unavailable", failed[0].text
        assert "cannot store more" in failed[0].json()["error"]
    finally:
        core.close()


@pytest.mark.slow  # the delivery engine and the hourly purge run; the test waits for the first purge
def test_the_service_purges_at_start(db_path: Path) -> None:
    import time
    from datetime import timedelta

    from sqlalchemy import update
    from starlette.testclient import TestClient

    from promptyoself.store import schedules
    from promptyoself.store.db import Schedule

    settings = make_settings(db_path, letta_base_url="http://127.0.0.1:9", http_token=TOKEN,
                             executor_autostart=True, stdio_relay="off")
    core = Core(settings)
    try:
        ids = _cancelled_with_history(core, 2)
        with core.store.session() as s:  # ended 8 days ago: past PROMPTYOSELF_KEEP_ENDED (7d)
            s.execute(update(Schedule).where(Schedule.id.in_(ids)).values(updated_at=core.now() - timedelta(days=8)))
        with TestClient(build_service_app(core, settings, delivery=True), base_url="http://127.0.0.1:8000"):
            for _ in range(200):
                if all(schedules.get(core.store, sid) is None for sid in ids):
                    break
                time.sleep(0.05)
        assert all(schedules.get(core.store, sid) is None for sid in ids)
    finally:
        core.close()
