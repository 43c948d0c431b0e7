"""The holdings' hand-over to the recorder (``delivery.holdings``), as plain state on one event loop.

The recorder task waits for ``Holdings``' recorder event with no timeout; during a backlog a sent
attempt wakes it only for a batch, or when no other attempt can join the batch soon. The peer bench
found the tail of a burst where the last attempt of a backlog was queued without a wake-up: it stayed
unrecorded, its agent busy in that worker for good, and the agent's next prompts were never claimed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from promptyoself.delivery.attempt import Attempt, Claim
from promptyoself.delivery.holdings import Holdings
from promptyoself.delivery.watch import AuthBackoff, Gate, LoopState

T0 = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)


def claim(sid: int, agent: str) -> Claim:
    base: dict[str, Any] = {
        "id": sid, "agent_id": agent, "prompt_text": "P", "due_at": T0, "attempt": 0, "repetition_count": 0,
        "max_repetitions": None, "state": "active", "created_at": T0, "updated_at": T0, "last_run": None,
        "last_error": None, "target": "letta", "conversation_id": None, "catch_up": "latest", "max_per_day": None,
        "idempotency_key": None, "claimed_by": "me", "claim_until": T0, "letta_payload": None,
        "target_options": None, "schedule_type": "once", "schedule_value": "", "timezone": "UTC", "anchor": None,
        "overlap": None,
    }
    return Claim(next_run=T0, **base)


def holdings() -> Holdings:
    state = LoopState()
    state.start()
    return Holdings(2, 60.0, Gate(state, AuthBackoff()))


def test_the_last_attempt_of_a_backlog_wakes_the_recorder() -> None:
    async def scenario() -> None:
        h = holdings()
        want = h.claim_wanted()
        claims = [claim(i, f"agent-{i}") for i in range(want)]
        assert h.took(claims, want) is True and h.backlog()  # a full claim: a backlog
        first, second = await h.next_to_send(), await h.next_to_send()
        assert first is not None and second is not None
        h._recorder.clear()  # the recorder waits (it has just looked)
        h.sent(first, Attempt(first, "me", "delivered", T0, 1), 0.02)
        h.sent(second, Attempt(second, "me", "delivered", T0, 1), 0.02)
        # nothing else in flight: no attempt can join these two soon, so the recorder must look now
        assert h._recorder.is_set()
        batch = await asyncio.wait_for(h.next_batch(), 1.0)  # a state, not a time: it does not hang
        assert batch is not None and {a.claim.id for a in batch[0]} == {first.id, second.id}

    asyncio.run(scenario())



def test_a_full_lane_is_left_out_of_the_alarms_read_only_outside_a_backlog() -> None:
    """Leaving a target out of ``next_due`` walks every due row of it (the scale-out's backlog of
    10,000 rows: a scan per read). During a backlog the recorder's claims serve every lane with room,
    so the alarm's read leaves nothing out; outside one, a full lane is left out (its polling ends)."""
    async def scenario() -> None:
        h = holdings()
        want = h.claim_wanted()
        assert h.took([claim(i, f"agent-{i}") for i in range(want)], want) is True  # a full claim: a backlog
        assert [await h.next_to_send() for _ in range(2)] != [None, None]  # both send slots taken
        assert h.backlog() and h.full_targets() == []
        want = h.claim_wanted()
        h.took([], want)  # a claim that found nothing: the backlog is over
        assert not h.backlog() and h.full_targets() == ["letta"]

    asyncio.run(scenario())
