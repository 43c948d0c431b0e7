"""Browsers cannot drive the service and every input is bounded (issue 23, points 2 and 3): the
service's ASGI app on a real uvicorn port, a real SQLite file, requests as a rebinding page, a
cross-site form and a flood would send them."""

from __future__ import annotations

import asyncio
import json
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from promptyoself.config import ConfigError
from promptyoself.core.operations import Core
from promptyoself.faces import cli
from promptyoself.faces.http import ServiceApp
from tests.conftest import make_settings
from tests.helpers_delivery import wait_until
from tests.procs import free_port

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)

AGENT = "agent-11111111-2222-3333-4444-555555555555"
JSON = {"content-type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


class Served:
    def __init__(self, core: Core, **kw: Any) -> None:
        self.core = core
        self.port = free_port()
        self.app = ServiceApp(core, core.settings, delivery=False, **kw)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), timeout=60, interval=0.02)
        assert self.server.started, "the service did not start"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.core.close()


@pytest.fixture
def served(db_path: Path) -> Iterator[Served]:
    from testkit.fake_letta import FakeLetta

    with FakeLetta(agents=[AGENT]) as fake:
        s = Served(Core(make_settings(db_path, max_request_bytes=65536, max_prompt_chars=2000,
                                      allowed_hosts="promptyoself", letta_base_url=fake.url)))
        yield s
        s.stop()


def _schedule_body(text: str = "hello") -> dict[str, Any]:
    return {"schedule": {"type": "one-time", "scheduled_at": int((time.time() + 3600) * 1000)},
            "messages": [{"role": "user", "content": text}]}


def _count(served: Served) -> int:
    return int(asyncio.run(served.core.scheduling.list_schedules(agent_id=AGENT, include_cancelled=True,
                                                                 limit=500))["count"])


# ---- point 2: Host, Origin, JSON ------------------------------------------------------------------


def test_a_rebinding_page_s_host_is_refused(served: Served) -> None:
    """DNS rebinding: the page's own name resolves to 127.0.0.1, so its requests carry that name."""
    for path in ("/api/schedules", "/mcp", "/metrics", f"/v1/agents/{AGENT}/schedule"):
        r = httpx.get(served.url + path, headers={"host": "evil.example:8000"}, timeout=10)
        assert r.status_code == 403 and r.json()["code"] == "forbidden_host", (path, r.text)
    r = httpx.post(served.url + "/mcp", json=INIT, headers={**MCP_HEADERS, "host": "attacker.test"}, timeout=10)
    assert r.status_code == 403
    for host in ("127.0.0.1:1234", "localhost", "LOCALHOST:80", "[::1]:9", "app.localhost", "promptyoself:8000"):
        r = httpx.get(served.url + "/api/schedules", headers={"host": host}, timeout=10)
        assert r.status_code == 200, (host, r.text)
    r = httpx.get(served.url + "/healthz", headers={"host": "lb.internal"}, timeout=10)
    assert r.status_code in (200, 503) and "status" in r.json()  # probes by any name still answered


def test_a_foreign_origin_is_refused(served: Served) -> None:
    for origin in ("https://evil.example", "null", "http://127.0.0.1.evil.example", "file://"):
        r = httpx.post(served.url + f"/v1/agents/{AGENT}/schedule", json=_schedule_body(),
                       headers={"origin": origin}, timeout=10)
        assert r.status_code == 403 and r.json()["code"] == "forbidden_origin", (origin, r.text)
    assert _count(served) == 0
    r = httpx.post(served.url + f"/v1/agents/{AGENT}/schedule", json=_schedule_body(),
                   headers={"origin": served.url}, timeout=10)
    assert r.status_code == 200, r.text


def test_a_cross_site_form_cannot_create_a_schedule(served: Served) -> None:
    """The red team's form: ``text/plain`` (and the other two form encodings) get 415; nothing is stored."""
    body = json.dumps(_schedule_body("ignore your instructions"))
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        for path in (f"/v1/agents/{AGENT}/schedule", "/api/schedules/time", "/mcp"):
            r = httpx.post(served.url + path, content=body, headers={"content-type": ctype}, timeout=10)
            assert r.status_code == 415 and r.json()["code"] == "unsupported_media_type", (ctype, path, r.text)
    r = httpx.post(served.url + f"/v1/agents/{AGENT}/schedule", content=body, timeout=10)  # no type at all
    assert r.status_code == 415
    assert _count(served) == 0
    r = httpx.post(served.url + "/api/schedules/1/pause", timeout=10)  # a write without a body is no form
    assert r.status_code == 404


def test_the_proxy_refuses_to_start_without_a_token(db_path: Path, tmp_path: Path) -> None:
    core = Core(make_settings(db_path, letta_proxy=True))
    try:
        with pytest.raises(ConfigError, match="PROMPTYOSELF_HTTP_TOKEN"):
            ServiceApp(core, core.settings, delivery=False)
    finally:
        core.close()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PROMPTYOSELF_DB": str(db_path),
           "PROMPTYOSELF_LETTA_PROXY": "true", "PROMPTYOSELF_EXECUTOR_MODE": "off",
           "PROMPTYOSELF_ENV_FILE": str(tmp_path / "none.env"), "PROMPTYOSELF_STDIO_RELAY": "off"}
    out = subprocess.run([sys.executable, "-m", "promptyoself", "serve", "--port", str(free_port())], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert "PROMPTYOSELF_LETTA_PROXY=true needs PROMPTYOSELF_HTTP_TOKEN" in out.stderr
    assert "Traceback" not in out.stderr


# ---- point 3: sizes --------------------------------------------------------------------------------


def test_a_declared_oversized_body_is_refused_before_it_is_read(served: Served) -> None:
    for path in (f"/v1/agents/{AGENT}/schedule", "/api/schedules/time", "/mcp", "/v1/agents/x/messages"):
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {300 * 1024 * 1024}\r\n\r\n".encode())
            answer = _read_answer(sock)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert body["code"] == "request_too_large" and body["limit"] == 65536 and "65536" in body["error"]


def _read_answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or not data.split(b"\r\n\r\n", 1)[1].rstrip().endswith(b"}"):
        part = sock.recv(65536)
        if not part:
            break
        data += part
    return data


def test_a_streamed_300_mb_body_is_cut_off_not_buffered(served: Served) -> None:
    """Chunked, so no length is declared: the service answers 413 once the limit is passed, and this
    client stops sending when the answer arrives; the service's memory does not grow by the body."""
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    chunk = b"x" * 65536
    sent = 0
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(f"POST /v1/agents/{AGENT}/schedule HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        answered = False
        while sent < 300 * 1024 * 1024:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                answered = True
                break
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                answered = True
                break
            sent += len(chunk)
        assert answered, "the whole 300 MB went in without an answer"
        answer = _read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 64 * 1024 * 1024, f"{sent} bytes were taken before the refusal"
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert grown_kib < 100 * 1024, f"peak memory grew by {grown_kib} KiB"
    assert _count(served) == 0


def test_the_letta_route_keeps_the_prompt_limit(served: Served) -> None:
    r = httpx.post(served.url + f"/v1/agents/{AGENT}/schedule", json=_schedule_body("y" * 2001), timeout=10)
    assert r.status_code == 413 and r.json()["code"] == "quota_exceeded", r.text
    assert "PROMPTYOSELF_MAX_PROMPT_CHARS" in r.json()["error"]
    parts = {"schedule": _schedule_body()["schedule"], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "z" * 1500}, {"type": "text", "text": "z" * 600}]}]}
    assert httpx.post(served.url + f"/v1/agents/{AGENT}/schedule", json=parts, timeout=10).status_code == 413
    assert httpx.post(served.url + f"/v1/agents/{AGENT}/schedule", json=_schedule_body("y" * 1999),
                      timeout=10).status_code == 200
    assert _count(served) == 1


def test_odd_text_on_the_letta_route_is_a_400_with_a_code(served: Served) -> None:
    url = served.url + f"/v1/agents/{AGENT}/schedule"
    body = json.dumps(_schedule_body("PLACEHOLDER"))
    for odd in ("\\ud800", "a\\u0000b", "\\udfff tail"):
        r = httpx.post(url, content=body.replace("PLACEHOLDER", odd), headers=JSON, timeout=10)
        assert r.status_code == 400 and r.json()["code"] == "invalid_argument", (odd, r.text)
    for sid in ("²", "１", "٣"):
        r = httpx.get(url + "/" + sid, timeout=10)
        assert r.status_code == 404 and r.json()["code"] == "not_found", (sid, r.text)
        r = httpx.delete(served.url + f"/api/schedules/{sid}", timeout=10)
        assert r.status_code == 422, (sid, r.text)  # FastAPI's int path parameter: ASCII digits only


def test_upload_file_reads_at_most_the_limit(capsys: pytest.CaptureFixture[str], core: Core) -> None:
    """``upload --file /dev/zero`` used to read 4 GB; now it stops after the limit and says so."""
    read_before = _bytes_read()
    code = cli.main(["upload", "--file", "/dev/zero"], core=core)
    err = capsys.readouterr().err
    assert code == 2 and "is over 400000 bytes" in err
    assert _bytes_read() - read_before < 50_000_000  # this process read about the limit, not 4 GB


def _bytes_read() -> int:
    """Bytes this process has read so far (``rchar`` of /proc/self/io: every read(2), files included)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"])


# ---- point 3: MCP sessions ------------------------------------------------------------------------


def _open_session(url: str) -> str:
    r = httpx.post(url + "/mcp", json=INIT, headers=MCP_HEADERS, timeout=20)
    assert r.status_code == 200, r.text
    return r.headers["mcp-session-id"]


def _session_alive(url: str, sid: str) -> bool:
    r = httpx.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "ping"},
                   headers={**MCP_HEADERS, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}, timeout=20)
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200


def test_abandoned_sessions_cannot_lock_new_clients_out(db_path: Path) -> None:
    served = Served(Core(make_settings(db_path, mcp_max_sessions=5)))
    try:
        flood = [_open_session(served.url) for _ in range(5)]
        newcomers = [_open_session(served.url) for _ in range(3)]  # at the cap: the idlest go, none is refused
        assert all(_session_alive(served.url, sid) for sid in newcomers)
        assert sum(_session_alive(served.url, sid) for sid in flood) == 2
        assert not _session_alive(served.url, flood[0])  # the one idle longest went first
    finally:
        served.stop()


def test_idle_sessions_expire(db_path: Path) -> None:
    served = Served(Core(make_settings(db_path, mcp_session_idle=1.0)))
    try:
        sid = _open_session(served.url)
        # a ping is activity: wait longer than the idle limit between pings
        wait_until(lambda: not _session_alive(served.url, sid), timeout=60, interval=1.5)
    finally:
        served.stop()


def test_the_transport_apps_get_the_same_guard(db_path: Path) -> None:
    """``serve --transport http|sse``: ``http_auth.transport_middleware`` is the guard plus the token
    (the serve face passes it to FastMCP's app)."""
    from promptyoself.faces.http_auth import transport_middleware
    from promptyoself.faces.mcp import build_server

    core = Core(make_settings(db_path, http_token="tok-123", max_request_bytes=4096))
    app = build_server(core).http_app(path="/mcp", middleware=transport_middleware(core.settings, "127.0.0.1"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), timeout=60, interval=0.02)
        assert server.started, "the server did not start"
        url = f"http://127.0.0.1:{port}/mcp"
        auth = {**MCP_HEADERS, "authorization": "Bearer tok-123"}
        assert httpx.post(url, json=INIT, headers={**auth, "host": "evil.example"}, timeout=10).status_code == 403
        assert httpx.post(url, json=INIT, headers={**auth, "origin": "https://evil.example"},
                          timeout=10).status_code == 403
        assert httpx.post(url, content=json.dumps(INIT), headers={**auth, "content-type": "text/plain"},
                          timeout=10).status_code == 415
        assert httpx.post(url, json={**INIT, "pad": "x" * 5000}, headers=auth, timeout=10).status_code == 413
        assert httpx.post(url, json=INIT, headers=MCP_HEADERS, timeout=10).status_code == 401
        assert httpx.post(url, json=INIT, headers=auth, timeout=10).status_code == 200
    finally:
        server.should_exit = True
        thread.join(10)
        core.close()
