"""Fencing (issue 9 point 1): a claim carries a deadline from its last successful renewal, a sender
never starts a send on a claim past that deadline minus a margin, a failed renewal is noticed and a
lost claim is dropped. Fake monotonic clock, real SQLite file, the fake Letta."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from promptyoself.delivery.attempt import Claim
from promptyoself.delivery.attempt import attempt as send_attempt
from promptyoself.delivery.claim_keeper import ClaimKeeper
from promptyoself.store.claims import claim_due
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import T0, Clock, add_schedule, get, make_core


def attempt(*args: Any, **kw: Any) -> Any:
    """``attempt.attempt`` (a coroutine) run to its end from these synchronous tests."""
    return asyncio.run(send_attempt(*args, **kw))


pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)

LEASE = 30.0


class Mono:
    """A settable monotonic clock."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def fake() -> Iterator[FakeLetta]:
    with FakeLetta(agents=2) as f:
        yield f


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def core(tmp_path: Path, fake: FakeLetta, clock: Clock) -> Iterator[Any]:
    c = make_core(tmp_path / "f.db", fake, clock=clock, lease_seconds=LEASE)
    yield c
    c.close()


def take(core: Any, owner: str) -> list[Claim]:
    now = core.now()
    rows = claim_due(core.store, owner, now, now + timedelta(seconds=LEASE), limit=10)
    return [Claim.from_row(r) for r in rows]


class UnstartedKeeper(ClaimKeeper):
    """A keeper whose renewal task never runs (the executor's task group runs it in production): the
    tests drive renewals with ``await renew_now()``. A live renewer races the fake monotonic clock: a renewal it
    makes after a test moved ``mono`` to model a frozen process really extends the claim in the
    database (the wall clock did not move; a frozen process's thread would be frozen too), so the
    fence rightly says yes and the test, not the product, is wrong (1 run in 3 under load)."""


def keeper(core: Any, owner: str, mono: Mono) -> ClaimKeeper:
    return UnstartedKeeper(core.store, owner, LEASE, core.now, mono=mono)


def test_may_send_until_deadline_minus_margin(core: Any, fake: FakeLetta) -> None:
    mono = Mono()
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    k = keeper(core, "A", mono)
    claimed_at = mono()
    [c] = take(core, "A")
    k._ids.add(c.id)  # what add() does, without starting the renewal thread
    k._deadline[c.id] = claimed_at + LEASE
    assert k.margin == pytest.approx(LEASE / 3)
    mono.t += LEASE - LEASE / 3 - 0.01
    assert k.may_send(sid)
    mono.t += 0.02
    assert not k.may_send(sid)  # inside the margin: no new send starts
    assert not k.may_send(sid + 1000)  # never claimed


def test_a_successful_renewal_moves_the_deadline(core: Any, fake: FakeLetta, clock: Clock) -> None:
    mono = Mono()
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    k = keeper(core, "A", mono)
    [c] = take(core, "A")
    k._ids.add(c.id)
    k._deadline[c.id] = mono() + LEASE
    mono.t += LEASE / 2
    clock.advance(LEASE / 2)
    asyncio.run(k.renew_now())
    mono.t += LEASE / 2 + 1  # past the first deadline, within the renewed one
    assert k.may_send(sid)
    assert get(core.store, sid).claimed_by == "A"


def test_a_failed_renewal_lets_the_deadline_run_out(core: Any, fake: FakeLetta, monkeypatch: Any) -> None:
    mono = Mono()
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    k = keeper(core, "A", mono)
    [c] = take(core, "A")
    k._ids.add(c.id)
    k._deadline[c.id] = mono() + LEASE

    async def broken(*_a: Any, **_k: Any) -> set[int]:
        raise RuntimeError("database down")

    monkeypatch.setattr("promptyoself.delivery.claim_keeper.renew_claims", broken)
    mono.t += LEASE / 3
    asyncio.run(k.renew_now())  # fails: logged, the deadline stays
    assert k.may_send(sid)  # still inside the lease the last good renewal gave
    mono.t += LEASE / 3 + 0.01
    assert not k.may_send(sid)


def test_a_renewal_that_finds_the_claim_taken_over_drops_it(core: Any, fake: FakeLetta, clock: Clock) -> None:
    mono = Mono()
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    k = keeper(core, "A", mono)
    [c] = take(core, "A")
    k._ids.add(c.id)
    k._deadline[c.id] = mono() + LEASE
    clock.advance(LEASE + 1)  # A stalled (its monotonic clock too, say a suspend) and B took over
    assert [x.id for x in take(core, "B")] == [sid]
    asyncio.run(k.renew_now())
    assert not k.may_send(sid)  # even though A's monotonic deadline has not run out
    assert sid not in k._ids
    assert get(core.store, sid).claimed_by == "B"  # A's renewal did not touch B's claim


def test_a_sender_past_the_deadline_sends_nothing(core: Any, fake: FakeLetta, clock: Clock) -> None:
    """The stalled holder of issue 9: it wakes after its lease with a queued claim; it must not send
    it, and must leave the new holder's claim alone."""
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    [c] = take(core, "A")
    clock.advance(LEASE + 1)
    assert [x.id for x in take(core, "B")] == [sid]
    out = attempt(core, c, "A", may_send=lambda: False)
    assert not isinstance(out, type(None))
    assert getattr(out, "outcome", None) == "released"
    assert fake.received == []
    assert get(core.store, sid).claimed_by == "B"
    # the new holder sends it once
    out_b = attempt(core, Claim.from_row(get(core.store, sid)), "B", may_send=lambda: True)
    assert getattr(out_b, "kind", None) == "delivered"
    assert len(fake.received) == 1


def test_the_executor_fences_every_claim_it_queues(tmp_path: Path, fake: FakeLetta) -> None:
    """The executor's fence (its ``ClaimKeeper``, asked by every send): a claim whose keeper deadline
    has run out is released, not sent."""
    c = make_core(tmp_path / "e.db", fake, lease_seconds=LEASE)
    try:
        sid = add_schedule(c.store, fake.agent_ids[0], "p", c.now() - timedelta(seconds=1))
        mono = Mono()
        fence = keeper(c, "test", mono)
        [claim] = take(c, "test")
        fence.add([claim.id], mono())
        mono.t += LEASE  # the process froze for a whole lease between claiming and sending
        out = attempt(c, claim, "test", may_send=lambda: fence.may_send(claim.id))
        assert getattr(out, "outcome", None) == "released"
        assert fake.received == []
        assert get(c.store, sid).claimed_by is None  # given back: anyone may take it now
    finally:
        c.close()


def test_the_client_asks_the_guard_last_and_sends_nothing_when_it_says_no(fake: FakeLetta) -> None:
    from promptyoself.errors import NotSent
    from promptyoself.letta.client import LettaClient

    agent = fake.agent_ids[0]
    with LettaClient(fake.url) as client:
        assert client.send_message(agent, "x", guard=lambda: True)["route"] == "async"
        with pytest.raises(NotSent):
            client.send_message(agent, "y", guard=lambda: False)
        assert client.send_message(agent, "z")["route"] == "async"  # the client serves on
    assert fake.received_texts() == ["x", "z"]
    assert len(fake.requests) == 2  # the refused send never reached Letta


def test_the_client_asks_the_guard_again_once_connected_right_before_the_write(fake: FakeLetta) -> None:
    """Between the first question and the write come the connection pool and a TCP connect: a
    process frozen there (a SIGSTOP in the torture test, twice in twelve runs) wrote its request
    seconds later, after its claim had run out and a successor had sent the occurrence. The guard
    is asked again in httpcore's ``send_request_headers``, with the socket ready and nothing
    written; saying no there sends nothing, and the client serves on."""
    from promptyoself.errors import NotSent
    from promptyoself.letta.client import LettaClient

    agent = fake.agent_ids[0]
    asked: list[int] = []

    def stalls_after_first_ask() -> bool:
        asked.append(len(asked))
        return len(asked) == 1

    with LettaClient(fake.url) as client:
        with pytest.raises(NotSent):
            client.send_message(agent, "frozen", guard=stalls_after_first_ask)
        assert asked == [0, 1]
        assert fake.requests == [] and fake.received == []
        asked.clear()
        assert client.send_message(agent, "x", guard=lambda: asked.append(0) is None)["route"] == "async"
        assert len(asked) == 2  # before the request, and once the connection was ready
    assert fake.received_texts() == ["x"]


def test_the_fence_is_asked_again_right_before_the_send(core: Any, fake: FakeLetta, clock: Clock) -> None:
    """A holder that stalls after the first fence (here: during the look-up in Letta that an in-doubt
    occurrence needs) must not send when it resumes: the fence is asked again just before the write."""
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    fake.fail_next(1, "drop")  # a reset: not recorded by Letta, but the outcome is unknown: in doubt
    first = attempt(core, take(core, "A")[0], "A")
    from promptyoself.delivery.recorder import record_attempt

    assert not isinstance(first, type(None)) and getattr(first, "kind", None) == "retry"
    asyncio.run(record_attempt(core, first))  # type: ignore[arg-type]
    clock.advance(60)
    [again] = take(core, "A")
    assert again.in_doubt
    answers = iter([True, False])  # passes the first fence, then "stalls" past its deadline
    out = attempt(core, again, "A", may_send=lambda: next(answers))
    assert getattr(out, "outcome", None) == "released"
    assert fake.received == []
    assert [m for m, _p, _s in fake.requests] == ["POST", "GET", "GET"]  # the reset POST, then only the look-up
    assert get(core.store, sid).claimed_by is None


def test_a_claim_taken_over_is_never_given_back_unsent(core: Any, fake: FakeLetta, clock: Clock) -> None:
    """The expired claim is the only mark that its holder may have sent: a successor that gives up the
    occurrence unsent (fenced, or stopping) leaves its claim to run out, so the next one asks Letta too."""
    from promptyoself.delivery.attempt import give_back

    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    take(core, "A")  # A claims and dies (maybe after sending)
    clock.advance(LEASE + 1)
    taken: set[int] = set()
    now = core.now()
    [row] = claim_due(core.store, "B", now, now + timedelta(seconds=LEASE), limit=1, taken_over=taken)
    b = Claim.from_row(row, taken_over=row.id in taken)
    assert b.taken_over and b.in_doubt
    assert getattr(attempt(core, b, "B", may_send=lambda: False), "outcome", None) == "released"
    asyncio.run(give_back(core, "B", [b]))  # the loop's way on stopping: the same rule
    assert get(core.store, sid).claimed_by == "B"  # not released
    clock.advance(LEASE + 1)
    taken.clear()
    now = core.now()
    [row] = claim_due(core.store, "C", now, now + timedelta(seconds=LEASE), limit=1, taken_over=taken)
    assert Claim.from_row(row, taken_over=row.id in taken).in_doubt  # C asks Letta before sending
    assert fake.received == []
