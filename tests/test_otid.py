"""Letta-side idempotency (issue 9 points 2-4): every occurrence carries a deterministic ``otid``;
an attempt whose outcome is unknown makes the next one ask Letta first, and record ``delivered``
without sending when Letta has it. Real SQLite file, the fake Letta (accept-then-timeout,
accept-then-reset, delayed visibility), ``httpx.MockTransport`` for the client's unit tests."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from promptyoself.delivery.attempt import IN_DOUBT_PREFIX, Claim, otid_for
from promptyoself.delivery.recorder import deliver
from promptyoself.errors import TargetUnavailable
from promptyoself.letta.client import IN_DOUBT, LettaClient
from promptyoself.store.claims import claim_due
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import T0, Clock, add_schedule, get, history, make_core

LEASE = 5.0
AGENT = "agent-00000000-0000-4000-8000-000000000001"


@pytest.fixture
def fake() -> Iterator[FakeLetta]:
    with FakeLetta(agents=2, timeout_sleep=1.0) as f:
        yield f


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def core(tmp_path: Path, fake: FakeLetta, clock: Clock) -> Iterator[Any]:
    c = make_core(tmp_path / "o.db", fake, clock=clock, letta_timeout=0.4)
    yield c
    c.close()


def take(core: Any, owner: str = "A") -> Claim:
    now = core.now()
    taken: set[int] = set()
    [row] = claim_due(core.store, owner, now, now + timedelta(seconds=LEASE), limit=1, taken_over=taken)
    return Claim.from_row(row, taken_over=row.id in taken)


def posts(fake: FakeLetta) -> int:
    return sum(1 for method, _path, _status in fake.requests if method == "POST")


def gets(fake: FakeLetta) -> int:
    return sum(1 for method, _path, _status in fake.requests if method == "GET")


# ---- the key ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_otid_is_per_occurrence(core: Any, fake: FakeLetta, clock: Clock) -> None:
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0, schedule_type="interval", value="1h")
    first = take(core)
    assert otid_for(first) == otid_for(Claim.from_row(get(core.store, sid)))  # a retry reuses it
    assert deliver(core, first, "A").outcome == "delivered"
    clock.advance(hours=1)
    second = take(core)
    assert second.next_run == T0 + timedelta(hours=1)
    assert otid_for(second) != otid_for(first)  # the next occurrence gets its own
    assert deliver(core, second, "A").outcome == "delivered"
    assert [m["otid"] for m in fake.received] == [otid_for(first), otid_for(second)]


@pytest.mark.slow
def test_the_happy_path_costs_no_extra_request(core: Any, fake: FakeLetta) -> None:
    add_schedule(core.store, fake.agent_ids[0], "p", T0)
    assert deliver(core, take(core), "A").outcome == "delivered"
    assert (posts(fake), gets(fake)) == (1, 0)


# ---- outcome unknown -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["accepted_timeout", "accepted_drop"])
def test_accepted_then_lost_answer_is_not_sent_again(core: Any, fake: FakeLetta, clock: Clock, mode: str) -> None:
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    fake.fail_next(1, mode)
    first = deliver(core, take(core), "A")
    assert first.outcome == "retry" and (first.error or "").startswith(IN_DOUBT_PREFIX)
    assert len(fake.received) == 1  # Letta has it; we could not tell
    clock.advance(60)
    again = take(core)
    assert again.in_doubt
    res = deliver(core, again, "A")
    assert res.outcome == "delivered" and res.state == "completed"
    assert len(fake.received) == 1  # asked, not sent
    assert [h.outcome for h in history(core.store, sid)] == ["retry", "delivered"]
    # history names the run that carried it, though the answer naming it was lost (issue 23)
    assert history(core.store, sid)[-1].letta_run_id == fake.received[0]["run_id"] is not None


@pytest.mark.slow
def test_a_message_not_yet_visible_waits_for_its_run(core: Any, fake: FakeLetta, clock: Clock) -> None:
    """Letta shows an async message only once its run starts: while the agent has a run queued,
    the check neither sends nor gives up."""
    fake.configure(visible_delay=1.0)
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    fake.fail_next(1, "accepted_drop")
    assert deliver(core, take(core), "A").outcome == "retry"
    clock.advance(60)
    pending = deliver(core, take(core), "A")
    assert pending.outcome == "retry" and "runs pending" in (pending.error or "")
    assert len(fake.received) == 1
    time.sleep(1.1)
    clock.advance(60)
    res = deliver(core, take(core), "A")
    assert res.outcome == "delivered" and len(fake.received) == 1
    assert [h.outcome for h in history(core.store, sid)] == ["retry", "retry", "delivered"]


@pytest.mark.slow
def test_a_request_that_never_arrived_is_sent_after_the_check(core: Any, fake: FakeLetta, clock: Clock) -> None:
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    fake.fail_next(1, "timeout")  # Letta did NOT record it (the fake never records a plain timeout)
    assert deliver(core, take(core), "A").outcome == "retry"
    clock.advance(60)
    res = deliver(core, take(core), "A")
    assert res.outcome == "delivered" and len(fake.received) == 1
    assert gets(fake) == 2  # the check (runs, messages) found nothing, so it was sent
    assert [h.outcome for h in history(core.store, sid)] == ["retry", "delivered"]


@pytest.mark.slow
def test_a_plain_server_error_is_retried_without_a_check(core: Any, fake: FakeLetta, clock: Clock) -> None:
    add_schedule(core.store, fake.agent_ids[0], "p", T0)
    fake.fail_next(1, 503)
    res = deliver(core, take(core), "A")
    assert res.outcome == "retry" and not (res.error or "").startswith(IN_DOUBT_PREFIX)
    clock.advance(60)
    assert not take(core).in_doubt


# ---- the client (MockTransport) --------------------------------------------------------------------


def client_for(handler: Any) -> LettaClient:
    return LettaClient("http://letta.test", transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(
    ("exc", "doubt"),
    [
        (httpx.ConnectError("refused"), False),
        (httpx.ConnectTimeout("slow connect"), False),
        (httpx.ReadTimeout("no answer"), True),
        (httpx.RemoteProtocolError("reset"), True),
        (httpx.ReadError("reset"), True),
    ],
)
def test_client_says_when_a_send_may_have_arrived(exc: Exception, doubt: bool) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    with pytest.raises(TargetUnavailable) as info:
        client_for(handler).send_message(AGENT, "hi", otid="k")
    assert info.value.details[IN_DOUBT] is doubt


@pytest.mark.parametrize(("status", "doubt"), [(500, False), (503, False), (429, False), (502, True), (504, True)])
def test_client_status_doubt(status: int, doubt: bool) -> None:
    with pytest.raises(TargetUnavailable) as info:
        client_for(lambda r: httpx.Response(status, json={"detail": "x"})).send_message(AGENT, "hi", otid="k")
    assert bool(info.value.details.get(IN_DOUBT)) is doubt


def test_client_sends_the_otid_on_the_message() -> None:
    seen: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"id": "run-1", "status": "created"})

    assert client_for(handler).send_message(AGENT, "hi", otid="k-1") == {"run_id": "run-1", "route": "async"}
    assert seen == [{"messages": [{"role": "user", "content": "hi", "otid": "k-1"}]}]


# ---- a caller's own otid (issue 29 item 7) -------------------------------------------------------


def test_the_scheduling_route_refuses_a_callers_otid(tmp_path: Path) -> None:
    """``POST /v1/agents/A/schedule`` with ``otid`` on a message: a 400 that says why, nothing stored."""
    from starlette.testclient import TestClient

    from promptyoself.core.operations import Core
    from promptyoself.faces.rest import build_rest_app
    from tests.conftest import make_settings

    core = Core(make_settings(tmp_path / "r.db"))
    try:
        body = {"schedule": {"type": "one-time", "scheduled_at": 4_102_444_800_000},
                "messages": [{"role": "user", "content": "m", "otid": "mine"}]}
        with TestClient(build_rest_app(core)) as client:
            answer = client.post(f"/v1/agents/{AGENT}/schedule", json=body)
            assert answer.status_code == 400
            assert answer.json()["code"] == "invalid_argument"
            assert "messages[0].otid is set by PromptYoSelf" in answer.json()["error"]
            assert client.get(f"/v1/agents/{AGENT}/schedule").json()["scheduled_messages"] == []
    finally:
        core.close()


def test_our_otid_replaces_a_callers_on_the_wire() -> None:
    seen: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"id": "run-1", "status": "created"})

    payload = {"messages": [{"role": "user", "content": "a", "otid": "mine"},
                            {"role": "user", "content": "b", "otid": "mine-too"}], "max_steps": 3}
    client_for(handler).send_message(AGENT, "a", otid="k-1", payload=payload)
    assert seen == [{"messages": [{"role": "user", "content": "a", "otid": "k-1"}, {"role": "user", "content": "b"}],
                     "max_steps": 3}]
    assert payload["messages"][0]["otid"] == "mine"  # the stored payload is left as it is


@pytest.mark.slow
def test_a_stored_callers_otid_is_still_delivered_once_when_letta_hangs(
    core: Any, fake: FakeLetta, clock: Clock
) -> None:
    """A schedule stored (before the route refused it) with the caller's otid, Letta hanging past the
    client's timeout after recording the message: the next attempt finds it by our otid, sends nothing."""
    from promptyoself.store.db import Schedule

    sid = add_schedule(core.store, fake.agent_ids[0], "m", T0)
    with core.store.session() as s:
        row = s.get(Schedule, sid)
        assert row is not None
        row.letta_payload = json.dumps({"messages": [{"role": "user", "content": "m", "otid": "mine"}]})
    fake.fail_next(1, "accepted_timeout")
    first = deliver(core, take(core), "A")
    assert first.outcome == "retry" and (first.error or "").startswith(IN_DOUBT_PREFIX)
    clock.advance(60)
    again = take(core)
    assert deliver(core, again, "A").outcome == "delivered"
    assert [m["otid"] for m in fake.received] == [otid_for(again)]  # once, by our otid
    assert [h.outcome for h in history(core.store, sid)] == ["retry", "delivered"]


@pytest.mark.parametrize(
    ("runs", "messages", "answer"),
    [
        ([{"status": "completed"}], [{"otid": "k"}], "found"),
        ([{"status": "running"}], [{"otid": "k"}], "found"),
        ([{"status": "completed"}], [{"otid": "other"}, {"otid": None}], "absent"),
        ([], [], "absent"),
        ([{"status": "created"}], [{"otid": "other"}], "pending"),
        ([{"status": "running"}, {"status": "completed"}], [], "pending"),
    ],
)
def test_find_message(runs: list[Any], messages: list[Any], answer: str) -> None:
    order: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        order.append(request.url.path)
        if request.url.path == "/v1/runs/":
            assert request.url.params["agent_id"] == AGENT
            return httpx.Response(200, json=runs)
        assert request.url.path == f"/v1/agents/{AGENT}/messages"
        return httpx.Response(200, json=messages)

    assert client_for(handler).find_message(AGENT, "k") == answer
    assert order == ["/v1/runs/", f"/v1/agents/{AGENT}/messages"]  # runs first: see find_message


def test_find_message_run_names_the_run() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/runs/":
            return httpx.Response(200, json=[])
        return httpx.Response(200, json=[{"otid": "x", "run_id": "run-9"}, {"otid": "k", "run_id": "run-7"}])

    assert client_for(handler).find_message_run(AGENT, "k") == ("found", "run-7")
    assert client_for(handler).find_message_run(AGENT, "nope") == ("absent", None)


# ---- a real Letta --------------------------------------------------------------------------------


@pytest.mark.letta
def test_real_letta_one_occurrence_sent_twice_arrives_once(letta_env: tuple[Any, str], tmp_path: Path) -> None:
    """Against Letta 0.16.8: the first attempt's answer is lost (we send through the client and drop
    the answer); the retry of the same occurrence asks Letta, which lists the otid (after its run
    starts), and records ``delivered`` without a second copy."""
    http, agent = letta_env
    clock = Clock()
    core = make_core(tmp_path / "l.db", None, clock=clock, letta_base_url=str(http.base_url), letta_timeout=30.0)
    try:
        # A slot of its own per run: the otid is (schedule id, slot), and this server keeps earlier runs' messages.
        slot = T0 - timedelta(milliseconds=time.time_ns() // 1000 % 10**7)
        sid = add_schedule(core.store, agent, f"promptyoself otid test {time.time_ns()}", slot)
        first = take(core)
        otid = otid_for(first)
        core.letta.send_message(agent, "first copy, answer lost", otid=otid)  # attempt 1: Letta has it
        from dataclasses import replace

        claim = replace(first, in_doubt=True)  # what a timeout after the write leaves behind
        outcomes: list[str] = []
        for _ in range(60):
            res = deliver(core, claim, "A")
            outcomes.append(res.outcome)
            if res.outcome == "delivered":
                break
            assert res.outcome == "retry" and "runs pending" in (res.error or "")  # not visible yet
            time.sleep(0.5)
            clock.advance(60)
            claim = take(core)
            assert claim.in_doubt
        assert outcomes[-1] == "delivered"
        msgs = core.letta._request("GET", f"/v1/agents/{agent}/messages", params={"limit": 100}).json()
        assert sum(1 for m in msgs if m.get("otid") == otid) == 1  # one copy in Letta
        assert [h.outcome for h in history(core.store, sid)][-1] == "delivered"
        assert sum(1 for h in history(core.store, sid) if h.outcome == "delivered") == 1
    finally:
        core.close()


# ---- in doubt past the misfire grace, auth errors, the settle time --------------------------------


@pytest.mark.slow
def test_in_doubt_past_the_grace_asks_letta_and_records_delivered(core: Any, fake: FakeLetta, clock: Clock) -> None:
    """A one-time prompt whose answer was lost and whose next attempt comes after the misfire grace:
    Letta has it, so it is ``delivered`` (not ``missed``), and it is not sent again."""
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    fake.fail_next(1, "accepted_drop")
    assert deliver(core, take(core), "A").outcome == "retry"
    clock.advance(hours=25)  # beyond PROMPTYOSELF_MISFIRE_GRACE (24h)
    res = deliver(core, take(core), "A")
    assert res.outcome == "delivered" and res.state == "completed"
    assert len(fake.received) == 1 and posts(fake) == 1
    assert [h.outcome for h in history(core.store, sid)] == ["retry", "delivered"]


@pytest.mark.slow
def test_in_doubt_past_the_grace_and_not_in_letta_is_missed(core: Any, fake: FakeLetta, clock: Clock) -> None:
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    fake.fail_next(1, "drop")  # a reset: in doubt, but Letta never got it
    assert deliver(core, take(core), "A").outcome == "retry"
    clock.advance(hours=25)
    res = deliver(core, take(core), "A")
    assert res.outcome == "missed" and "not at the letta target" in (res.error or "")
    assert fake.received == [] and posts(fake) == 1 and gets(fake) == 2  # asked, then not sent: too late
    assert get(core.store, sid).state == "completed"


@pytest.mark.slow
def test_an_auth_error_keeps_the_occurrence_in_doubt(core: Any, fake: FakeLetta, clock: Clock) -> None:
    add_schedule(core.store, fake.agent_ids[0], "p", T0)
    fake.configure(visible_delay=0.5)
    fake.fail_next(1, "accepted_drop")  # Letta has it, the answer is lost
    assert deliver(core, take(core), "A").outcome == "retry"
    fake.password = "now-required"  # then the credentials are refused (the look-up answers 401)
    clock.advance(60)
    res = deliver(core, take(core), "A")
    assert res.auth_error and (res.error or "").startswith(IN_DOUBT_PREFIX)
    fake.password = None
    time.sleep(0.6)
    clock.advance(60)
    again = take(core)
    assert again.in_doubt  # so the next attempt asks again instead of sending a second copy
    assert deliver(core, again, "A").outcome == "delivered" and len(fake.received) == 1


@pytest.mark.slow
def test_the_settle_time_counts_from_the_write(fake: FakeLetta) -> None:
    """The client's timeout runs from the request's start, a connect included; a request written late
    in it (here the guard, asked with the connection ready, takes 0.3 s) gave Letta that much less
    time. The error says how late it was written, and the retry waits that much longer."""
    from promptyoself.delivery.retry import RetryPolicy
    from promptyoself.errors import WRITTEN_AFTER

    asked: list[int] = []

    def slow_to_write() -> bool:
        asked.append(1)
        if len(asked) == 2:  # the second question, with the connection ready
            time.sleep(0.3)
        return True

    fake.fail_next(1, "slow")  # answered (and recorded) after the client's timeout
    with LettaClient(fake.url, timeout=0.6) as client, pytest.raises(TargetUnavailable) as info:
        client.send_message(fake.agent_ids[0], "p", otid="o-1", guard=slow_to_write)
    err = info.value
    assert err.details[IN_DOUBT] is True
    assert 0.3 <= err.details[WRITTEN_AFTER] < 0.6
    decision = RetryPolicy(base=0.01, cap=0.01, settle=0.6).decide(err, 1, late=0.0, in_doubt=False)
    assert decision.delay == pytest.approx(0.6 + err.details[WRITTEN_AFTER])


@pytest.mark.slow
def test_an_answer_lost_in_flight_waits_at_least_the_client_timeout(core: Any, fake: FakeLetta) -> None:
    """A request Letta was still working on when the client gave up must land before the next attempt
    asks for it: that retry waits at least PROMPTYOSELF_LETTA_TIMEOUT (a 503 only its backoff)."""
    add_schedule(core.store, fake.agent_ids[0], "p", T0)
    add_schedule(core.store, fake.agent_ids[1], "q", T0)
    fake.fail_next(1, "slow")  # answered (and recorded) after the client's timeout
    fake.fail_next(1, 503)
    slow = deliver(core, take(core), "A")
    plain = deliver(core, take(core), "A")
    assert slow.outcome == plain.outcome == "retry"
    assert slow.retry_in is not None and slow.retry_in >= core.settings.letta_timeout
    assert plain.retry_in is not None and plain.retry_in < core.settings.letta_timeout
