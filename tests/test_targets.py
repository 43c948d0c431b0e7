"""Targets as plug-ins (issue 30 point 3): the registry names every target a schedule may go to and
builds it from the settings; the Letta REST and Letta Code targets keep the ``DeliveryTarget``
contract (send behind the fence, look-up, probe, readiness). In process: the REST client on
``httpx.MockTransport``; the Letta Code target without an App Server."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from promptyoself.config import Settings
from promptyoself.errors import AgentNotFound, InvalidArgument, NotSent, TargetUnavailable
from promptyoself.letta.client import IN_DOUBT, AsyncLettaClient
from promptyoself.targets import registry
from promptyoself.targets.base import DeliveryTarget, Fence, Found, Occurrence, Sent
from promptyoself.targets.letta.target import LettaRestTarget
from promptyoself.targets.letta_code.target import LettaCodeTarget

AGENT = "agent-11111111-2222-3333-4444-555555555555"
DUE = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)


def settings(tmp_path: Path, **kw: Any) -> Settings:
    return Settings(db=str(tmp_path / "t.db"), executor_autostart=False, **kw)


def occurrence(**kw: Any) -> Occurrence:
    values: dict[str, Any] = {"schedule_id": 7, "occurrence_id": "promptyoself-7-1", "agent_id": AGENT,
                              "text": "[PromptYoSelf] #7\nhello", "prompt": "hello", "due": DUE}
    values.update(kw)
    return Occurrence(**values)


class Letta:
    """A Letta that answers from memory: sends are kept, runs and messages listed back."""

    def __init__(self, *, status: int = 200) -> None:
        self.status = status
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "POST" and path.endswith("/messages/async"):
            if self.status != 200:
                return httpx.Response(self.status, json={"detail": f"agent {AGENT} says no"})
            self.bodies.append(json.loads(request.content))
            return httpx.Response(200, json={"id": f"run-{len(self.bodies)}"})
        if path == "/v1/runs/":
            return httpx.Response(200, json=[])
        if path.endswith("/messages"):
            return httpx.Response(200, json=[{"otid": m["otid"], "run_id": f"run-{i + 1}"}
                                             for i, b in enumerate(self.bodies) for m in b["messages"]])
        if path == "/v1/agents/":
            return httpx.Response(200, json=[{"id": AGENT}])
        return httpx.Response(404, json={"detail": "not found"})


def rest(tmp_path: Path, letta: Letta) -> LettaRestTarget:
    client = AsyncLettaClient("http://letta.test", transport=httpx.MockTransport(letta))
    return LettaRestTarget(settings(tmp_path), client=client)


def test_the_registry_names_the_built_in_targets_and_builds_them(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert {"letta", "letta-code"} <= set(registry.names())
    monkeypatch.setenv("LETTA_CODE_URL", "ws://127.0.0.1:4500")
    s = settings(tmp_path)
    for name, kind in (("letta", LettaRestTarget), ("letta-code", LettaCodeTarget), (None, LettaRestTarget)):
        target = registry.create(name, s)
        assert isinstance(target, kind) and isinstance(target, DeliveryTarget)
        assert target.name == (name or "letta")
        asyncio.run(target.aclose())


def test_an_unknown_target_is_an_invalid_argument(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="letta-code"):
        registry.create("carrier-pigeon", settings(tmp_path))


class Echo:
    """A target of a test's own: what a new plug-in needs, and nothing more."""

    name = "echo"

    def __init__(self, settings: Settings) -> None:
        self.sent: list[str] = []

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        if not fence():
            raise NotSent("fenced")
        self.sent.append(occ.occurrence_id)
        return Sent(route="echo")

    async def lookup(self, occ: Occurrence) -> Found:
        return Found("found" if occ.occurrence_id in self.sent else "absent")

    async def probe(self) -> None:
        return None

    def readiness(self) -> str:
        return "echo: ready"

    async def aclose(self) -> None:
        return None


def test_a_target_registered_at_run_time_is_built_like_the_others(tmp_path: Path) -> None:
    registry.register("echo", Echo)
    try:
        target = registry.create("echo", settings(tmp_path))
        assert "echo" in registry.names() and isinstance(target, DeliveryTarget)
        occ = occurrence()
        assert asyncio.run(target.send(occ, lambda: True)).route == "echo"
        assert asyncio.run(target.lookup(occ)).state == "found"
    finally:
        registry.unregister("echo")
    assert "echo" not in registry.names()
    with pytest.raises(ValueError):
        registry.register("Not A Name", Echo)


def test_rest_send_carries_the_occurrence_id_as_otid_and_looks_it_up(tmp_path: Path) -> None:
    letta = Letta()
    target = rest(tmp_path, letta)
    occ = occurrence()

    async def scenario() -> tuple[Found, Sent, Found]:
        before = await target.lookup(occ)
        sent = await target.send(occ, lambda: True)
        return before, sent, await target.lookup(occ)

    before, sent, after = asyncio.run(scenario())
    assert before == Found("absent")
    assert sent.route == "async" and sent.run_id == "run-1"
    assert letta.bodies == [{"messages": [{"role": "user", "content": occ.text, "otid": occ.occurrence_id}]}]
    assert after == Found("found", "run-1")
    asyncio.run(target.aclose())


def test_rest_send_sends_a_stored_payload_with_the_otid(tmp_path: Path) -> None:
    letta = Letta()
    target = rest(tmp_path, letta)
    payload = {"messages": [{"role": "user", "content": "from the scheduling API"}], "max_steps": 3}
    asyncio.run(target.send(occurrence(options={"payload": payload}), lambda: True))
    assert letta.bodies == [{"messages": [{"role": "user", "content": "from the scheduling API",
                                           "otid": "promptyoself-7-1"}], "max_steps": 3}]


def test_rest_send_behind_a_closed_fence_writes_nothing(tmp_path: Path) -> None:
    letta = Letta()
    with pytest.raises(NotSent):
        asyncio.run(rest(tmp_path, letta).send(occurrence(), lambda: False))
    assert letta.bodies == []


@pytest.mark.parametrize(("status", "error", "doubt"), [(503, TargetUnavailable, False),
                                                         (504, TargetUnavailable, True),
                                                         (404, AgentNotFound, None)])
def test_rest_failures_map_onto_the_error_tree(tmp_path: Path, status: int, error: type[Exception],
                                               doubt: bool | None) -> None:
    with pytest.raises(error) as info:
        asyncio.run(rest(tmp_path, Letta(status=status)).send(occurrence(), lambda: True))
    if doubt is not None:
        assert bool(getattr(info.value, "details", {}).get(IN_DOUBT)) is doubt


def test_rest_probe_and_readiness(tmp_path: Path) -> None:
    target = rest(tmp_path, Letta())
    asyncio.run(target.probe())
    assert target.readiness() == "Letta REST API at http://letta.test"


def test_letta_code_without_a_url_is_unavailable_not_dropped(tmp_path: Path) -> None:
    target = LettaCodeTarget(settings(tmp_path))
    assert "LETTA_CODE_URL not set" in target.readiness()
    for call in (target.send(occurrence(), lambda: True), target.lookup(occurrence()), target.probe()):
        with pytest.raises(TargetUnavailable):
            asyncio.run(call)
    asyncio.run(target.aclose())


def test_found_accepts_only_the_three_answers() -> None:
    assert Found.of("pending") == Found("pending")
    with pytest.raises(ValueError):
        Found.of("maybe")


@pytest.mark.slow
def test_rest_target_asks_the_fence_once_connected_right_before_the_write(tmp_path: Path) -> None:
    from testkit.fake_letta import FakeLetta

    with FakeLetta(agents=1) as fake:
        target = LettaRestTarget(settings(tmp_path, letta_base_url=fake.url))
        asked: list[int] = []

        def stalls_after_first_ask() -> bool:  # the claim runs out between the pool and the write
            asked.append(1)
            return len(asked) == 1

        occ = occurrence(agent_id=fake.agent_ids[0])
        with pytest.raises(NotSent):
            asyncio.run(target.send(occ, stalls_after_first_ask))
        assert len(asked) == 2 and fake.received_texts() == []
        assert asyncio.run(target.send(occ, lambda: True)).route == "async"
        assert fake.received_texts() == [occ.text]
        asyncio.run(target.aclose())


@pytest.mark.slow
def test_rest_target_writes_each_request_in_the_same_loop_turn_as_its_last_fence(tmp_path: Path,
                                                                               monkeypatch: Any) -> None:
    """Eight sends at once, as a worker's senders start on a claimed batch. Each one's last fence
    must be followed by its socket write with nothing in between: no other task, no other send's
    fence. Asked at aiohttp's head trace, all eight fences passed in one turn of the loop and the
    writes came in later turns; the torture test's SIGSTOP landed between, and four or five
    requests went out when the process resumed, after their claims had run out (seed 12)."""
    import asyncio.selector_events as selector_events

    from testkit.fake_letta import FakeLetta

    events: list[Any] = []
    transport = selector_events._SelectorSocketTransport
    write, writelines = transport.write, transport.writelines

    def posted(data: Any) -> bool:
        return bytes(data[:5]) == b"POST "

    def watched_write(self: Any, data: Any) -> None:
        if posted(data):
            events.append("write")
        write(self, data)

    def watched_writelines(self: Any, chunks: Any) -> None:
        chunks = list(chunks)
        if chunks and posted(chunks[0]):
            events.append("write")
        writelines(self, chunks)

    monkeypatch.setattr(transport, "write", watched_write)
    monkeypatch.setattr(transport, "writelines", watched_writelines)

    with FakeLetta(agents=8) as fake:
        target = LettaRestTarget(settings(tmp_path, letta_base_url=fake.url))

        def fence(i: int) -> Fence:
            def ask() -> bool:
                events.append(("fence", i))
                return True
            return ask

        async def ticker() -> None:
            while True:
                events.append("tick")
                await asyncio.sleep(0)

        async def scenario() -> None:
            ticking = asyncio.create_task(ticker())
            try:
                await asyncio.gather(*(target.send(occurrence(agent_id=a, occurrence_id=f"o-{i}"), fence(i))
                                       for i, a in enumerate(fake.agent_ids)))
            finally:
                ticking.cancel()
                await target.aclose()

        asyncio.run(scenario())
        assert len(fake.received) == 8
    last = {e[1]: n for n, e in enumerate(events) if isinstance(e, tuple)}
    assert sorted(last) == list(range(8))
    assert [events[n + 1] for n in last.values()] == ["write"] * 8, events


def test_the_async_clients_answer_reads_as_the_routes_expect() -> None:
    """``_Read`` (what aiohttp's answer becomes) gives the routes what ``httpx.Response`` gave them:
    case-insensitive headers (a 429's Retry-After), JSON, text in the answer's charset or UTF-8, and
    a ValueError for a body that is not JSON (``_object`` then says the server is not Letta)."""
    from multidict import CIMultiDict, CIMultiDictProxy

    from promptyoself.letta.client import _object, _Read, raise_for_letta

    busy = _Read(429, CIMultiDictProxy(CIMultiDict({"Retry-After": "7"})), b'{"detail": "slow down"}', None)
    with pytest.raises(TargetUnavailable) as err:
        raise_for_letta(busy)
    assert err.value.details["retry_after"] == 7.0
    assert _Read(200, CIMultiDictProxy(CIMultiDict()), "ü".encode("latin-1"), "latin-1").text == "ü"
    assert _Read(200, CIMultiDictProxy(CIMultiDict()), "ü".encode(), "no-such-charset").text == "ü"
    with pytest.raises(TargetUnavailable, match="without a JSON object"):
        _object(_Read(200, CIMultiDictProxy(CIMultiDict()), b"<html>", "utf-8"))
    assert _object(_Read(200, CIMultiDictProxy(CIMultiDict()), b'{"id": "x"}', None)) == {"id": "x"}
