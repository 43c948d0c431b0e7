"""HTTP (streamable, /mcp) and SSE (/sse) transports as real subprocesses, with a real MCP client.

Servers bind 0.0.0.0 in some tests, but every connection goes to 127.0.0.1 only.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.transports import SSETransport, StreamableHttpTransport

from promptyoself.config import Settings
from promptyoself.core.operations import Core
from promptyoself.faces.mcp import build_server
from promptyoself.faces.serve import check_exposure, is_loopback
from tests.procs import PYTHON, SERVER_SCRIPT, ServerProcess, free_port, running_server, server_env

TOKEN = "tok-3f9a1c2e7b5d4a60-transport-test"
AGENT_HDR = "agent-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
AGENT_ARG = "agent-12345678-1234-4234-8234-123456789abc"


class Served:
    def __init__(self, transport: str, port: int, proc: ServerProcess, token: str | None) -> None:
        self.transport = transport
        self.port = port
        self.proc = proc
        self.token = token

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{'mcp' if self.transport == 'http' else 'sse'}"

    def client(self, headers: dict[str, str] | None = None, token: str | None = None) -> Client[Any]:
        hdrs = dict(headers or {})
        bearer = token if token is not None else self.token
        if bearer:
            hdrs["Authorization"] = f"Bearer {bearer}"
        cls = StreamableHttpTransport if self.transport == "http" else SSETransport
        return Client(cls(self.url, headers=hdrs), timeout=30)


def _serve(tmp: Path, transport: str, *extra: str, token: str | None = None) -> Iterator[Served]:
    port = free_port()
    env = server_env(tmp / f"{transport}.db")
    if token:
        env["PROMPTYOSELF_HTTP_TOKEN"] = token
    args = ["--transport", transport, "--port", str(port), *extra]
    with running_server(args, env, tmp, port) as proc:
        yield Served(transport, port, proc, token)


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Streamable HTTP on the default bind address, no token."""
    yield from _serve(tmp_path_factory.mktemp("http"), "http")


@pytest.fixture(scope="module")
def sse_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """SSE on the default bind address, no token."""
    yield from _serve(tmp_path_factory.mktemp("sse"), "sse")


@pytest.fixture(scope="module")
def exposed_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Streamable HTTP bound to 0.0.0.0 with --allow-external and a token."""
    yield from _serve(tmp_path_factory.mktemp("exposed"), "http", "--host", "0.0.0.0", "--allow-external",
                      token=TOKEN)


@pytest.fixture(scope="module")
def token_sse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """SSE on loopback with a token: the token is enforced on any address, and on both SSE routes."""
    yield from _serve(tmp_path_factory.mktemp("tsse"), "sse", token=TOKEN)


@pytest.fixture(params=["http", "sse"])
def served(request: pytest.FixtureRequest) -> Served:
    return request.getfixturevalue(f"{request.param}_server")


def _listen_address(port: int) -> str | None:
    """The local address a LISTEN socket on ``port`` is bound to, from /proc/net/tcp (Linux)."""
    table = Path("/proc/net/tcp")
    if not table.exists():
        return None
    for line in table.read_text().splitlines()[1:]:
        fields = line.split()
        local, state = fields[1], fields[3]
        addr_hex, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:
            raw = bytes.fromhex(addr_hex)[::-1]
            return ".".join(str(b) for b in raw)
    return None


def _in_memory_tool_names(tmp_path: Path) -> set[str]:
    import asyncio

    core = Core(Settings(db=str(tmp_path / "mem.db"), executor_autostart=False))
    try:
        async def names() -> set[str]:
            async with Client(build_server(core)) as c:
                return {t.name for t in await c.list_tools()}

        return asyncio.run(names())
    finally:
        core.close()


@pytest.fixture(scope="module")
def in_memory_tools(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return _in_memory_tool_names(tmp_path_factory.mktemp("mem"))


# ---- the same tools over both transports -------------------------------------------------------


@pytest.mark.slow
async def test_same_tools_as_in_memory(served: Served, in_memory_tools: set[str]) -> None:
    async with served.client() as c:
        names = {t.name for t in await c.list_tools()}
    assert names == in_memory_tools
    assert "promptyoself_schedule_time" in names and "health" in names


@pytest.mark.slow
async def test_schedule_and_list(served: Served) -> None:
    async with served.client() as c:
        made = await c.call_tool(
            "promptyoself_schedule_cron",
            {"prompt": f"standup via {served.transport}", "cron": "0 9 * * MON-FRI", "agent_id": AGENT_ARG,
             "timezone": "Europe/Berlin", "skip_validation": True},
        )
        assert made.structured_content["status"] == "success"
        listed = await c.call_tool("promptyoself_list", {"agent_id": AGENT_ARG})
    ids = [s["id"] for s in listed.structured_content["schedules"]]
    assert made.structured_content["id"] in ids


@pytest.mark.slow
async def test_errors_are_tool_errors(served: Served) -> None:
    async with served.client() as c:
        result = await c.call_tool(
            "promptyoself_schedule_time", {"prompt": "x", "time": "not a time", "agent_id": AGENT_ARG,
                                           "skip_validation": True},
            raise_on_error=False,
        )
    assert result.is_error
    body = json.loads(result.content[0].text)
    assert body["status"] == "error" and body["code"] == "invalid_time"


@pytest.mark.slow
async def test_x_agent_id_header_is_used(served: Served) -> None:
    async with served.client(headers={"X-Agent-Id": AGENT_HDR}) as c:
        made = await c.call_tool(
            "promptyoself_schedule_time",
            {"prompt": "from the header", "time": "in 10m", "skip_validation": True},
        )
        diag = await c.call_tool("promptyoself_inference_diagnostics", {})
        explicit = await c.call_tool(
            "promptyoself_schedule_time",
            {"prompt": "explicit wins", "time": "in 10m", "agent_id": AGENT_ARG, "skip_validation": True},
        )
        mine = await c.call_tool("promptyoself_list", {})
    assert made.structured_content["agent_id"] == AGENT_HDR
    d = diag.structured_content
    assert d["inferred_agent_id"] == AGENT_HDR
    assert d["inference_debug"]["source"] == "http_header"
    assert explicit.structured_content["agent_id"] == AGENT_ARG
    # list without agent_id uses the same inference: only the header agent's schedules.
    rows = mine.structured_content["schedules"]
    assert rows and {r["agent_id"] for r in rows} == {AGENT_HDR}


@pytest.mark.slow
async def test_without_header_no_agent(served: Served) -> None:
    async with served.client() as c:
        result = await c.call_tool(
            "promptyoself_schedule_time", {"prompt": "who?", "time": "in 10m", "skip_validation": True},
            raise_on_error=False,
        )
    assert result.is_error
    assert json.loads(result.content[0].text)["code"] == "agent_required"


@pytest.mark.slow
def test_default_bind_is_loopback(served: Served) -> None:
    addr = _listen_address(served.port)
    if addr is None:
        pytest.skip("no /proc/net/tcp here")
    assert addr == "127.0.0.1"
    assert "Uvicorn running on http://127.0.0.1:" in served.proc.stderr()


@pytest.mark.slow
def test_nothing_on_stdout(served: Served) -> None:
    """Even over HTTP, logs (uvicorn's included) go to stderr, never stdout."""
    proc = served.proc.proc
    assert proc is not None and proc.stdout is not None
    import os
    import select

    ready, _, _ = select.select([proc.stdout], [], [], 0)
    data = os.read(proc.stdout.fileno(), 65536) if ready else b""
    assert data == b""


# ---- binding rules ------------------------------------------------------------------------------


@pytest.mark.slow
def test_exposed_bind_refused_without_flag_or_token(tmp_path: Path) -> None:
    """0.0.0.0 without --allow-external, and with it but without a token: exit 2, reason on stderr."""
    port = free_port()
    no_flag = ["--transport", "http", "--host", "0.0.0.0", "--port", str(port)]
    no_token = [*no_flag, "--allow-external"]
    procs = [
        subprocess.Popen([PYTHON, str(SERVER_SCRIPT), *args], env=server_env(tmp_path / "x.db"),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd="/", start_new_session=True)
        for args in (no_flag, no_token)
    ]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        outs.append((p.returncode, out.decode(), err.decode()))
    (rc1, out1, err1), (rc2, out2, err2) = outs
    assert rc1 == 2 and out1 == ""
    assert "--allow-external" in err1 and "0.0.0.0" in err1
    assert rc2 == 2 and out2 == ""
    assert "PROMPTYOSELF_HTTP_TOKEN" in err2
    assert _listen_address(port) is None


@pytest.mark.parametrize(
    ("host", "allow", "token", "refused"),
    [
        ("127.0.0.1", False, None, False),
        ("localhost", False, None, False),
        ("::1", False, None, False),
        ("127.0.0.2", False, None, False),
        ("0.0.0.0", False, None, True),
        ("::", False, None, True),
        ("192.168.1.5", False, TOKEN, True),
        ("0.0.0.0", True, None, True),
        ("0.0.0.0", True, "   ", True),
        ("0.0.0.0", True, TOKEN, False),
        ("example.com", True, TOKEN, False),
        ("127.0.0.1.example.com", False, None, True),
        ("0.0.0.0", True, "fifteen-chars-x", True),  # beyond loopback a token needs 16 characters
        ("0.0.0.0", True, "sixteen-chars-xy", False),
        ("127.0.0.1", False, "short", False),  # on loopback any token
    ],
)
def test_check_exposure(host: str, allow: bool, token: str | None, refused: bool) -> None:
    settings = Settings(http_token=token)
    problem = check_exposure(host, allow, settings)
    assert (problem is not None) == refused
    if problem:
        assert TOKEN not in problem and (token is None or not token.strip() or token not in problem)
    assert is_loopback(host) == (host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"))


def test_any_host_without_a_token_is_refused() -> None:
    """Issue 29 item 13: PROMPTYOSELF_ALLOWED_HOSTS=* without a token would let a DNS-rebinding page use
    the REST API: refused at start, on loopback too; with a token it is allowed."""
    from promptyoself.config import ConfigError
    from promptyoself.core.operations import Core
    from promptyoself.faces.http import build_service_app

    problem = check_exposure("127.0.0.1", False, Settings(allowed_hosts="*"))
    assert problem is not None and "PROMPTYOSELF_ALLOWED_HOSTS=*" in problem
    assert check_exposure("127.0.0.1", False, Settings(allowed_hosts="*", http_token=TOKEN)) is None
    assert check_exposure("127.0.0.1", False, Settings(allowed_hosts="app.example")) is None
    settings = Settings(allowed_hosts="*", executor_autostart=False, db=":memory:")
    with pytest.raises(ConfigError, match="ALLOWED_HOSTS"):
        build_service_app(Core(settings), settings, delivery=False)


# ---- bearer token -------------------------------------------------------------------------------

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "t", "version": "1"}},
}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "auth",
    [None, "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer", f"{TOKEN}"],
)
def test_http_needs_the_bearer_token(exposed_http: Served, auth: str | None) -> None:
    headers = dict(ACCEPT)
    if auth is not None:
        headers["Authorization"] = auth
    resp = httpx.post(exposed_http.url, json=INIT, headers=headers, timeout=10)
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"].startswith("Bearer")
    assert resp.json()["code"] == "unauthorized"
    assert TOKEN not in resp.text


@pytest.mark.slow
def test_exposed_server_binds_all_interfaces(exposed_http: Served) -> None:
    addr = _listen_address(exposed_http.port)
    if addr is None:
        pytest.skip("no /proc/net/tcp here")
    assert addr == "0.0.0.0"


@pytest.mark.slow
async def test_http_with_token_works(exposed_http: Served, in_memory_tools: set[str]) -> None:
    resp = httpx.post(exposed_http.url, json=INIT, headers={**ACCEPT, "Authorization": f"bearer {TOKEN}"},
                      timeout=10)
    assert resp.status_code == 200  # scheme is case-insensitive
    async with exposed_http.client(headers={"X-Agent-Id": AGENT_HDR}) as c:
        assert {t.name for t in await c.list_tools()} == in_memory_tools
        made = await c.call_tool("promptyoself_schedule_every",
                                 {"prompt": "p", "every": "1h", "skip_validation": True})
        assert made.structured_content["agent_id"] == AGENT_HDR


@pytest.mark.slow
async def test_wrong_token_client_fails(exposed_http: Served) -> None:
    from mcp.shared.exceptions import MCPError

    # The SDK client turns the 401 into a generic MCPError; the raw 401 is checked above.
    with pytest.raises(MCPError):
        async with exposed_http.client(token="not-it") as c:
            await c.list_tools()


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/sse", "/messages/?session_id=0123456789abcdef0123456789abcdef"])
def test_sse_routes_need_the_token(token_sse: Served, path: str) -> None:
    url = f"http://127.0.0.1:{token_sse.port}{path}"
    if path == "/sse":
        with httpx.stream("GET", url, timeout=10) as resp:
            assert resp.status_code == 401
        with httpx.stream("GET", url, headers={"Authorization": "Bearer nope"}, timeout=10) as resp:
            assert resp.status_code == 401
    else:
        resp = httpx.post(url, json=INIT, timeout=10)
        assert resp.status_code == 401


@pytest.mark.slow
async def test_sse_with_token_works(token_sse: Served) -> None:
    async with token_sse.client(headers={"X-Agent-Id": AGENT_HDR}) as c:
        made = await c.call_tool("promptyoself_schedule_time",
                                 {"prompt": "sse", "time": "in 1h", "skip_validation": True})
        listed = await c.call_tool("promptyoself_list", {})
    assert made.structured_content["agent_id"] == AGENT_HDR
    assert listed.structured_content["count"] == 1


@pytest.mark.slow
def test_token_never_logged(exposed_http: Served, token_sse: Served) -> None:
    for served in (exposed_http, token_sse):
        assert TOKEN not in served.proc.stderr()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["http", "sse"])
def test_the_mcp_only_servers_refuse_a_foreign_host_or_origin(
    kind: str, http_server: Served, sse_server: Served
) -> None:
    """`--transport http|sse` carry the service's request guard too (DNS rebinding, cross-site posts)."""
    served = http_server if kind == "http" else sse_server
    base = f"http://127.0.0.1:{served.port}"
    r = httpx.get(base + served.url.rsplit(str(served.port), 1)[1], headers={"Host": "evil.example"}, timeout=10)
    assert r.status_code == 403 and r.json()["code"] == "forbidden_host"
    r = httpx.post(served.url, content=b"{}", headers={"Origin": "https://evil.example",
                                                       "Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 403 and r.json()["code"] == "forbidden_origin"
