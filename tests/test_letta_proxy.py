"""The REST app's pass-through to Letta (``PROMPTYOSELF_LETTA_PROXY``): the whole SDK through one URL."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import uvicorn
from letta_client import AuthenticationError, Letta

from promptyoself.core.operations import Core
from promptyoself.faces.rest import build_rest_app
from tests.conftest import make_settings

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)

TOKEN = "proxy-token"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(core: Core, proxy: bool) -> Iterator[str]:
    port = _port()
    server = uvicorn.Server(uvicorn.Config(build_rest_app(core, letta_proxy=proxy), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(5)


@pytest.fixture
def secure_letta() -> Iterator[Any]:
    from testkit.fake_letta import FakeLetta

    with FakeLetta(agents=2, password="letta-pw") as fake:
        yield fake


@pytest.fixture
def proxied(db_path: Path, secure_letta: Any) -> Iterator[str]:
    core = Core(make_settings(db_path, letta_base_url=secure_letta.url, http_token=TOKEN,
                              letta_server_password="letta-pw"))
    yield from _serve(core, True)
    core.close()


def test_sdk_through_the_proxy(proxied: str, secure_letta: Any) -> None:
    client = Letta(base_url=proxied, api_key=TOKEN, max_retries=0)
    ids = sorted(a.id for a in client.agents.list())
    assert ids == sorted(secure_letta.agent_ids)  # Letta's own route, Letta's password added by the proxy
    agent = secure_letta.agent_ids[0]
    assert client.agents.retrieve(agent).id == agent
    # The scheduling routes are still ours, next to the proxy.
    made = client.agents.schedule.create(agent, schedule={"type": "recurring", "cron_expression": "0 9 * * *"},
                                         messages=[{"role": "user", "content": "hi"}])
    assert client.agents.schedule.retrieve(made.id, agent_id=agent).id == made.id
    # Letta's errors and redirects pass through unchanged.
    r = httpx.get(proxied + "/v1/agents/agent-00000000-0000-4000-8000-000000000000",
                  headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 404 and "not found" in r.json()["detail"]
    r = httpx.get(proxied + "/v1/agents", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 307 and r.headers["location"].endswith("/v1/agents/")


def test_proxy_needs_our_token(proxied: str) -> None:
    with pytest.raises(AuthenticationError):
        Letta(base_url=proxied, api_key="letta-pw", max_retries=0).agents.list()  # Letta's password is not ours
    assert httpx.get(proxied + "/v1/agents/").status_code == 401


def test_proxy_off_by_default(db_path: Path, secure_letta: Any) -> None:
    core = Core(make_settings(db_path, letta_base_url=secure_letta.url, http_token=TOKEN))
    for url in _serve(core, False):
        r = httpx.get(url + "/v1/agents/", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 404
    core.close()


class _Chunks(BaseHTTPRequestHandler):
    """Three events; the last is sent only once the client has the first (or after a minute): a proxy
    that buffered the stream would hold the first back until the end, and the client would not see it."""

    protocol_version = "HTTP/1.1"
    first_seen: ClassVar[threading.Event] = threading.Event()
    seen_before_last: ClassVar[list[bool]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(3):
            if i == 2:
                _Chunks.seen_before_last.append(_Chunks.first_seen.wait(60))
            data = f"data: {i}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: Any) -> None:
        pass


def test_streams_are_streamed(db_path: Path) -> None:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Chunks)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    core = Core(make_settings(db_path, letta_base_url=f"http://127.0.0.1:{upstream.server_address[1]}",
                              http_token=TOKEN))
    asyncio.run(core.operator.policy())  # the database opened first: a send is counted against the budget before
    # it is forwarded
    try:
        for url in _serve(core, True):
            _Chunks.first_seen.clear()
            _Chunks.seen_before_last.clear()
            events = []
            with httpx.stream("POST", url + "/v1/agents/agent-x/messages/stream", json={"messages": []},
                              headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        events.append(line)
                        _Chunks.first_seen.set()
            assert events == ["data: 0", "data: 1", "data: 2"]
            assert _Chunks.seen_before_last == [True]  # the first event came before the last was sent
    finally:
        upstream.shutdown()
        core.close()
