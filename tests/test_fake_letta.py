"""Tests for the fake Letta server (testkit/fake_letta.py), using httpx directly."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.fake_letta import LETTA_VERSION, FakeLetta, running_fake

ROOT = Path(__file__).resolve().parent.parent


def _msg(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


@pytest.fixture
def fake() -> Iterator[FakeLetta]:
    with running_fake(agents=3) as f:
        yield f


@pytest.fixture
def client(fake: FakeLetta) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, timeout=5) as c:
        yield c


# -- shape of the API -------------------------------------------------------------


@pytest.mark.slow
def test_health(client: httpx.Client) -> None:
    r = client.get("/v1/health/")
    assert r.status_code == 200
    assert r.json() == {"version": LETTA_VERSION, "status": "ok"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/agents"),
        ("GET", "/v1/health"),
        ("POST", "/v1/tools"),
        ("PUT", "/v1/tools"),
    ],
)
def test_missing_slash_redirects(
    fake: FakeLetta, client: httpx.Client, method: str, path: str
) -> None:
    r = client.request(method, path, params={"limit": 2})
    assert r.status_code == 307
    assert r.headers["location"] == f"{fake.url}{path}/?limit=2"
    assert (method, path, 307) in fake.requests


@pytest.mark.slow
def test_item_route_with_slash_redirects(fake: FakeLetta, client: httpx.Client) -> None:
    aid = fake.agent_ids[0]
    r = client.get(f"/v1/agents/{aid}/")
    assert r.status_code == 307
    assert r.headers["location"] == f"{fake.url}/v1/agents/{aid}"


@pytest.mark.slow
def test_redirect_can_be_followed(fake: FakeLetta) -> None:
    with httpx.Client(base_url=fake.url, follow_redirects=True) as c:
        r = c.get("/v1/agents", params={"order": "asc"})
    assert r.status_code == 200
    assert [a["id"] for a in r.json()] == fake.agent_ids


@pytest.mark.slow
def test_agent_lookup(fake: FakeLetta, client: httpx.Client) -> None:
    aid = fake.agent_ids[1]
    r = client.get(f"/v1/agents/{aid}")
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == aid
    assert {"name", "created_at", "updated_at", "description", "tags"} <= set(body)

    unknown = f"agent-{uuid.uuid4()}"
    r = client.get(f"/v1/agents/{unknown}")
    assert r.status_code == 404
    assert r.json() == {"detail": f"Agent with ID {unknown} not found"}

    r = client.get("/v1/agents/not-an-agent-id")
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["path", "agent_id"]

    r = client.post("/v1/agents/bogus/messages/async", json=_msg("x"))
    assert r.status_code == 422
    r = client.post(f"/v1/agents/{unknown}/messages", json=_msg("x"))
    assert r.status_code == 404
    assert fake.received == []


@pytest.mark.slow
def test_ids_have_letta_shape(fake: FakeLetta, client: httpx.Client) -> None:
    for aid in fake.agent_ids:
        assert aid.startswith("agent-")
        uuid.UUID(aid.removeprefix("agent-"))
    run = client.post(
        f"/v1/agents/{fake.agent_ids[0]}/messages/async", json=_msg("x")
    ).json()
    uuid.UUID(run["id"].removeprefix("run-"))


@pytest.mark.slow
def test_list_agents_paging_and_count(fake: FakeLetta, client: httpx.Client) -> None:
    ids = fake.agent_ids
    page1 = client.get("/v1/agents/", params={"limit": 2, "order": "asc"}).json()
    assert [a["id"] for a in page1] == ids[:2]
    page2 = client.get(
        "/v1/agents/", params={"limit": 2, "order": "asc", "after": ids[1]}
    ).json()
    assert [a["id"] for a in page2] == ids[2:]
    desc = client.get("/v1/agents/", params={"order": "desc"}).json()
    assert [a["id"] for a in desc] == ids[::-1]
    assert client.get("/v1/agents/", params={"limit": "x"}).status_code == 422
    assert client.get("/v1/agents/count").json() == 3

    new = fake.add_agent(name="late")
    assert client.get(f"/v1/agents/{new}").json()["name"] == "late"
    fake.remove_agent(ids[0])
    assert client.get(f"/v1/agents/{ids[0]}").status_code == 404
    assert client.get("/v1/agents/count").json() == 3


@pytest.mark.slow
def test_agents_from_names_and_fixed_ids() -> None:
    fixed = f"agent-{uuid.uuid4()}"
    with FakeLetta(agents=["alice", fixed]) as f, httpx.Client(base_url=f.url) as c:
        assert f.agent_ids[1] == fixed
        assert c.get(f"/v1/agents/{f.agent_ids[0]}").json()["name"] == "alice"


@pytest.mark.slow
def test_auth() -> None:
    with FakeLetta(agents=1, password="s3cret") as f, httpx.Client(base_url=f.url) as c:
        aid = f.agent_ids[0]
        assert c.get("/v1/health/").status_code == 200
        r = c.get("/v1/agents/")
        assert r.status_code == 401
        assert r.json() == {"detail": "Unauthorized"}
        bad = {"Authorization": "Bearer nope"}
        assert c.get("/v1/agents/", headers=bad).status_code == 401
        r = c.post(f"/v1/agents/{aid}/messages/async", json=_msg("x"))
        assert r.status_code == 401
        ok = c.get("/v1/agents/", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        bare = {"X-BARE-PASSWORD": "password s3cret"}
        r = c.post(f"/v1/agents/{aid}/messages/async", json=_msg("hi"), headers=bare)
        assert r.status_code == 200
        assert f.received_texts() == ["hi"]


# -- messages ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_runs_messages_and_usage_once_it_has_finished(fake: FakeLetta, client: httpx.Client) -> None:
    """As Letta 0.16.8: ``/v1/runs/{id}/messages`` (the turn: tool calls, returns, the answer) and
    ``/usage`` (UsageStatistics, no step count), nothing while the run has not finished."""
    fake.configure(reply_text="Done.", turn_tools=["memory_insert"], run_status="running")
    run = client.post(f"/v1/agents/{fake.agent_ids[0]}/messages/async", json=_msg("hi")).json()
    assert client.get(f"/v1/runs/{run['id']}/messages").json() == []
    assert client.get(f"/v1/runs/{run['id']}/usage").json()["total_tokens"] == 0
    fake.configure(run_status="completed")
    msgs = client.get(f"/v1/runs/{run['id']}/messages").json()
    assert [m["message_type"] for m in msgs] == ["tool_call_message", "tool_return_message", "assistant_message"]
    assert msgs[0]["tool_call"]["name"] == "memory_insert" and msgs[-1]["content"] == "Done."
    assert {m["run_id"] for m in msgs} == {run["id"]}
    usage = client.get(f"/v1/runs/{run['id']}/usage").json()
    assert usage == {**FakeLetta.turn_usage(2), "prompt_tokens_details": None, "completion_tokens_details": None}
    assert client.get(f"/v1/runs/run-{uuid.uuid4()}/usage").status_code == 404


@pytest.mark.slow
def test_async_message_and_run(fake: FakeLetta, client: httpx.Client) -> None:
    aid = fake.agent_ids[0]
    before = time.time()
    r = client.post(f"/v1/agents/{aid}/messages/async", json=_msg("hello"))
    assert r.status_code == 200
    run = r.json()
    assert run["id"].startswith("run-")
    assert run["status"] == "created"
    assert run["agent_id"] == aid

    r = client.get(f"/v1/runs/{run['id']}")
    assert r.status_code == 200
    assert r.json()["status"] == "completed"
    assert client.get(f"/v1/runs/run-{uuid.uuid4()}").status_code == 404

    [rec] = fake.received
    assert rec["agent_id"] == aid
    assert rec["text"] == "hello"
    assert rec["route"] == "async"
    assert rec["run_id"] == run["id"]
    assert before <= rec["at"] <= time.time()  # stamped when it arrived

    listed = client.get(f"/v1/agents/{aid}/messages", params={"limit": 5}).json()
    assert [(m["message_type"], m["content"]) for m in listed] == [
        ("user_message", "hello")
    ]


@pytest.mark.slow
def test_content_parts_and_messages_listing(
    fake: FakeLetta, client: httpx.Client
) -> None:
    aid = fake.agent_ids[0]
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}
    assert client.post(f"/v1/agents/{aid}/messages/async", json=body).is_success
    for i in range(3):
        client.post(f"/v1/agents/{aid}/messages", json=_msg(f"m{i}"))
    assert fake.received_texts() == ["a", "m0", "m1", "m2"]
    listed = client.get(f"/v1/agents/{aid}/messages", params={"limit": 2}).json()
    assert [m["content"] for m in listed] == ["m1", "m2"]


@pytest.mark.slow
def test_invalid_message_bodies(fake: FakeLetta, client: httpx.Client) -> None:
    url = f"/v1/agents/{fake.agent_ids[0]}/messages/async"
    assert client.post(url, json={"messages": []}).status_code == 422
    assert client.post(url, json={}).status_code == 422
    assert client.post(url, content=b"{not json").status_code == 422
    bad_role = {"messages": [{"role": "robot", "content": "x"}]}
    assert client.post(url, json=bad_role).status_code == 422
    assert fake.received == []


@pytest.mark.slow
def test_sync_message(fake: FakeLetta, client: httpx.Client) -> None:
    aid = fake.agent_ids[2]
    r = client.post(f"/v1/agents/{aid}/messages", json=_msg("sync hi"))
    assert r.status_code == 200
    body = r.json()
    assert isinstance(body["messages"], list)
    assert body["stop_reason"]["stop_reason"] == "end_turn"
    assert body["usage"] == {"message_type": "usage_statistics", **FakeLetta.turn_usage(1), "step_count": 1}
    assert body["messages"][-1]["message_type"] == "assistant_message" and body["messages"][-1]["content"] == "OK"
    assert fake.received[0]["route"] == "sync"
    assert fake.count_by_text() == {"sync hi": 1}


@pytest.mark.slow
def test_async_route_missing_falls_back() -> None:
    with FakeLetta(agents=1, async_route=False) as f, httpx.Client(base_url=f.url) as c:
        aid = f.agent_ids[0]
        r = c.post(f"/v1/agents/{aid}/messages/async", json=_msg("x"))
        assert r.status_code == 404
        r = c.post(f"/v1/agents/{aid}/messages", json=_msg("x"))
        assert r.status_code == 200
        assert [m["route"] for m in f.received] == ["sync"]


# -- failure injection ----------------------------------------------------------


@pytest.mark.slow
def test_fail_next_429_retry_after(fake: FakeLetta, client: httpx.Client) -> None:
    url = f"/v1/agents/{fake.agent_ids[0]}/messages/async"
    fake.fail_next(2, status=429, retry_after=3)
    for _ in range(2):
        r = client.post(url, json=_msg("x"))
        assert r.status_code == 429
        assert r.headers["retry-after"] == "3"
    assert fake.received == []
    assert client.post(url, json=_msg("x")).status_code == 200
    assert fake.received_texts() == ["x"]


@pytest.mark.slow
@pytest.mark.parametrize("status", [500, 401, 403, 404])
def test_fail_next_statuses(fake: FakeLetta, client: httpx.Client, status: int) -> None:
    url = f"/v1/agents/{fake.agent_ids[0]}/messages"
    fake.fail_next(1, status=status)
    r = client.post(url, json=_msg("x"))
    assert r.status_code == status
    assert "retry-after" not in r.headers
    assert fake.received == []
    assert client.post(url, json=_msg("x")).status_code == 200


def _statuses_with_seed(seed: int, n: int = 40) -> tuple[list[int], list[str]]:
    with (
        FakeLetta(agents=1, seed=seed, fail_rate=0.3, fail_modes=("500", "503")) as f,
        httpx.Client(base_url=f.url) as c,
    ):
        url = f"/v1/agents/{f.agent_ids[0]}/messages/async"
        statuses = [c.post(url, json=_msg(f"m{i}")).status_code for i in range(n)]
        return statuses, f.received_texts()


@pytest.mark.slow
def test_fail_rate_is_deterministic() -> None:
    a, texts_a = _statuses_with_seed(7)
    b, texts_b = _statuses_with_seed(7)
    c, _ = _statuses_with_seed(8)
    assert a == b
    assert texts_a == texts_b
    assert a != c
    assert set(a) <= {200, 500, 503}
    assert 0 < a.count(200) < len(a)
    # Only successful requests are recorded.
    assert texts_a == [f"m{i}" for i, s in enumerate(a) if s == 200]


@pytest.mark.slow
def test_reset_reseeds_and_clears(fake: FakeLetta, client: httpx.Client) -> None:
    fake.fail_rate = 0.5
    url = f"/v1/agents/{fake.agent_ids[0]}/messages"
    first = [client.post(url, json=_msg("x")).status_code for _ in range(20)]
    fake.fail_next(5)
    fake.reset()
    assert fake.received == [] and fake.requests == []
    second = [client.post(url, json=_msg("x")).status_code for _ in range(20)]
    assert first == second


@pytest.mark.slow
def test_timeout_and_drop_modes_do_not_record() -> None:
    with FakeLetta(agents=1, timeout_sleep=0.3) as f:
        url = f"{f.url}/v1/agents/{f.agent_ids[0]}/messages/async"
        f.fail_next(1, status="timeout")
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json=_msg("t"), timeout=0.1)
        f.fail_next(1, status="timeout")
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(url, json=_msg("t"), timeout=2)
        f.fail_next(1, status="drop")
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(url, json=_msg("d"), timeout=2)
        assert httpx.post(url, json=_msg("ok")).status_code == 200
        time.sleep(0.3)  # let the first timed-out request finish on the server
        assert f.received_texts() == ["ok"]
        assert sorted(s for _, _, s in f.requests) == [0, 0, 0, 200]


@pytest.mark.slow
def test_stop_does_not_wait_for_sleeping_handlers() -> None:
    f = FakeLetta(agents=1, timeout_sleep=30).start()
    f.fail_next(1, status="timeout")
    url = f"{f.url}/v1/agents/{f.agent_ids[0]}/messages"
    errors: list[BaseException] = []

    def post() -> None:
        try:
            httpx.post(url, json=_msg("x"), timeout=10)
        except httpx.HTTPError as exc:
            errors.append(exc)

    t = threading.Thread(target=post)
    t.start()
    time.sleep(0.2)
    f.stop()
    t.join(30)
    assert not t.is_alive()  # stop() did not wait for the pending request
    assert len(errors) == 1
    assert f.received == []
    assert not [th for th in threading.enumerate() if th.name.startswith("fake-letta")]


# -- concurrency ------------------------------------------------------------------


@pytest.mark.slow
def test_max_concurrent_per_agent() -> None:
    with FakeLetta(agents=2, latency=0.3) as f:
        a, b = f.agent_ids

        def send(agent_id: str, text: str) -> int:
            url = f"{f.url}/v1/agents/{agent_id}/messages/async"
            return httpx.post(url, json=_msg(text), timeout=5).status_code

        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(send, [a, a], ["p1", "p2"]))
        assert results == [200, 200]
        assert f.max_concurrent_per_agent == 2
        assert f.max_concurrent == 2

        f.reset()
        assert f.max_concurrent_per_agent == 0
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(send, [a, b], ["q1", "q2"]))
        assert f.max_concurrent_per_agent == 1
        assert f.max_concurrent == 2
        assert sorted(f.received_texts()) == ["q1", "q2"]


@pytest.mark.slow
def test_latency_applies_to_message_routes(
    fake: FakeLetta, client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.latency = 0.2
    waits: list[float] = []
    slept = fake._sleep

    def sleep(seconds: float) -> bool:
        waits.append(seconds)
        return slept(seconds)

    monkeypatch.setattr(fake, "_sleep", sleep)
    client.post(f"/v1/agents/{fake.agent_ids[0]}/messages", json=_msg("x"))
    assert waits == [0.2]  # the fake waited its latency before answering


# -- tools --------------------------------------------------------------------------


@pytest.mark.slow
def test_tools(fake: FakeLetta, client: httpx.Client) -> None:
    source = 'def send_later(prompt: str, at: str = "") -> str:\n    """Doc."""\n'
    r = client.post("/v1/tools/", json={"source_code": source, "tags": ["pys"]})
    assert r.status_code == 200
    tool = r.json()
    assert tool["id"].startswith("tool-")
    assert tool["name"] == "send_later"
    assert tool["json_schema"]["parameters"]["required"] == ["prompt"]

    r = client.put("/v1/tools/", json={"source_code": source, "description": "d"})
    assert r.status_code == 200
    assert r.json()["id"] == tool["id"]
    assert r.json()["description"] == "d"
    assert client.post("/v1/tools/", json={"source_code": source}).status_code == 409

    assert client.post("/v1/tools/", json={}).status_code == 422
    assert client.put("/v1/tools/", json={"source_code": "x = 1"}).status_code == 422
    assert client.put("/v1/tools/", json={"source_code": "def (:"}).status_code == 422
    assert set(fake.tools) == {"send_later"}


# -- control routes and subprocess mode -------------------------------------------


@pytest.mark.slow
def test_control_routes(fake: FakeLetta, client: httpx.Client) -> None:
    aid = fake.agent_ids[0]
    client.post(f"/v1/agents/{aid}/messages/async", json=_msg("s"))
    stats = client.get("/_fake/stats").json()
    assert [m["text"] for m in stats["received"]] == ["s"]
    assert stats["requests"] == 1
    assert stats["max_concurrent_per_agent"] == 1

    cfg = client.post("/_fake/config", json={"fail_rate": 1.0, "latency": 0.0}).json()
    assert cfg["fail_rate"] == 1.0
    assert client.post(f"/v1/agents/{aid}/messages", json=_msg("f")).status_code == 500
    assert client.post("/_fake/config", json={"nope": 1}).status_code == 400
    client.post("/_fake/config", json={"fail_rate": 0})

    client.post("/_fake/fail_next", json={"n": 1, "status": 429, "retry_after": 2})
    r = client.post(f"/v1/agents/{aid}/messages", json=_msg("f"))
    assert (r.status_code, r.headers["retry-after"]) == (429, "2")

    new = client.post("/_fake/agents", json={"name": "n"}).json()["id"]
    assert new in fake.agent_ids
    assert client.delete(f"/_fake/agents/{new}").status_code == 200
    assert new not in fake.agent_ids

    assert client.post("/_fake/reset").json() == {"ok": True}
    assert client.get("/_fake/stats").json()["received"] == []


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "fake_letta subprocess printed nothing"
    return proc.stdout.readline()


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_subprocess_mode(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testkit.fake_letta",
            "--agents",
            "3",
            "--latency",
            "0.01",
            "--seed",
            "1",
            "--state-file",
            str(state),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        ready = json.loads(_read_line(proc, 10))
        assert ready["url"].startswith("http://127.0.0.1:")
        assert len(ready["agent_ids"]) == 3
        assert json.loads(state.read_text())["url"] == ready["url"]
        with httpx.Client(base_url=ready["url"]) as c:
            assert c.get("/v1/health").status_code == 307
            for i, aid in enumerate(ready["agent_ids"]):
                path = f"/v1/agents/{aid}/messages/async"
                assert c.post(path, json=_msg(f"p{i}")).status_code == 200
            stats = c.get("/_fake/stats").json()
        assert sorted(m["text"] for m in stats["received"]) == ["p0", "p1", "p2"]
        assert stats["requests"] == 4
        assert stats["max_concurrent_per_agent"] == 1

        proc.send_signal(signal.SIGTERM)
        final = json.loads(_read_line(proc, 5))
        assert proc.wait(5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    assert len(final["received"]) == 3
    assert final["requests"] == 4
    assert json.loads(state.read_text())["requests"] == 4


# -- the HTTP layer: what the stock BaseHTTPRequestHandler did, byte for byte ------------------


@pytest.mark.parametrize(
    "block",
    [
        b"Host: a\r\nContent-Length: 5  \r\nX-Empty:\r\nx-dup: 1\r\nX-Dup:   2\t\r\n\r\n",
        b"Host: a\nB:c\n\n",
        b"Host: a\r\n",  # the connection ends inside the headers
        b"",
        b"\r\n",
        b"Host: a\r\n folded\r\n\r\n",
        b"From me: x\r\n\r\n",
        b"Bad Name: x\r\nHost: y\r\n\r\n",
        b"X: a\rb\r\n\r\n",
        b"X: caf\xe9\r\n\r\n",
        b":empty: v\r\n\r\n",
        b"Content-Type: application/json\r\nAuthorization: Bearer k\r\n\r\nBODY",
    ],
)
def test_headers_read_like_http_client(block: bytes) -> None:
    import io
    from http.client import parse_headers

    from testkit.fake_letta import _read_headers

    ours, stock = _read_headers(io.BytesIO(block)), parse_headers(io.BytesIO(block))
    assert ours.items() == stock.items()
    for name in ("host", "HOST", "x-dup", "Content-Length", "x", "absent"):
        assert ours.get(name) == stock.get(name)
        assert ours[name] == stock[name]
        assert (name in ours) == (name in stock)


def _raw_exchange(url: str, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection, half-close, return all the server answered."""
    import socket

    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.slow
def test_wire_answers(fake: FakeLetta) -> None:
    aid = fake.agent_ids[0]
    body = json.dumps(_msg("raw")).encode()
    post = (f"POST /v1/agents/{aid}/messages/async HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer a\r\n"
            f"authorization: Bearer b\r\nX-Fold: one\r\n two\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    # two requests on one kept-alive connection, then an HTTP/1.0 one that closes it
    answer = _raw_exchange(fake.url, post + body + post + body
                           + b"GET /v1/health/ HTTP/1.0\r\n\r\nGET /v1/health/ HTTP/1.1\r\n\r\n")
    heads = [part.split(b"\r\n\r\n", 1)[0].split(b"\r\n") for part in answer.split(b"HTTP/1.1 ")[1:]]
    assert len(heads) == 3  # nothing after the HTTP/1.0 request
    for head in heads:
        assert head[0] == b"200 OK"
        names = [line.split(b":", 1)[0] for line in head[1:]]
        assert names == [b"Server", b"Date", b"Content-Type", b"Content-Length"]
        assert head[1] == b"Server: uvicorn"
    assert fake.received_texts() == ["raw", "raw"]
    assert fake.counts()["by_sender"] == {"Bearer b": 2}  # the last Authorization line
    details = fake.request_details
    assert [d["status"] for d in details] == [200, 200, 200]
    assert details[0]["headers"] == {
        "Host": "h", "Authorization": "Bearer a", "authorization": "Bearer b",
        "X-Fold": "one\r\n two", "Content-Length": str(len(body)),
    }
    assert fake.requests[2] == ("GET", "/v1/health/", 200)

    # the stock error answers (before the version is known, as HTTP/0.9: a bare page)
    for request, code in [
        (b"GET /v1/health/ HTTP/1.x\r\n\r\n", 400),
        (b"GET /v1/health/ HTTP/2.0\r\n\r\n", 505),
        (b"GET /a b c HTTP/1.1\r\n\r\n", 400),
        (b"BREW /v1/health/ HTTP/1.1\r\n\r\n", 501),
        (b"GET /v1/health/ HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", 431),
        (b"GET /v1/health/ HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", 431),
    ]:
        assert f"Error code: {code}".encode() in _raw_exchange(fake.url, request)
    # Expect: 100-continue, a query string and a path starting with //
    cont = _raw_exchange(fake.url, b"GET //v1/agents/?limit=1 HTTP/1.1\r\nExpect: 100-continue\r\n"
                                   b"Connection: close\r\n\r\n")
    assert cont.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert len(json.loads(cont.split(b"\r\n\r\n", 2)[2])) == 1
