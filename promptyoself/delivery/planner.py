"""The claim planner, pure: how many occurrences an executor claims now, and what a claim's answer
means for the next one. Plain values in, plain values out (``tests/test_planner.py``); the loop
(``delivery.holdings``, in the engine) keeps the state and asks.

An executor holds claims waiting for a sender (``ready``) and claims being sent (``inflight``). Out of
a backlog it claims what its free senders can take; in a backlog (a claim came back full, or short
only because other processes took the rest) the queue runs ``ahead`` of the senders by up to
``3 * max_in_flight``, refilled in batches when it runs half empty, so a sender that finishes starts
its next send at once. Never more than the senders can send within ``LEASE_SHARE`` of the lease."""

from __future__ import annotations

from dataclasses import dataclass

LEASE_SHARE = 0.5
"""An executor holds no more claims than its senders can send within this share of the lease, at
the send time seen so far."""
AHEAD_PER_SENDER = 3
"""In a backlog, claims held beyond the senders: this many per sender."""


@dataclass(frozen=True)
class Holding:
    """What an executor holds and may do right now."""

    max_in_flight: int
    lease: float
    ready: int = 0
    inflight: int = 0
    ahead: int = 0
    send_s: float = 0.0
    """Moving average of one send's duration; 0 before the first."""
    paused: bool = False
    """No claim now: one is running, the last came back short (``drained``), the executor is stopping,
    or Letta refuses the credentials."""
    missed: bool = False
    """A backlog's last claim found every row taken by others: claim next with a recorded batch."""


def hold_limit(h: Holding) -> int:
    """Claims to hold at most (waiting plus being sent): the senders plus the backlog's run-ahead, but
    never more than they can send within ``LEASE_SHARE`` of the lease (and never fewer than one per
    sender)."""
    limit = h.max_in_flight + h.ahead
    if h.send_s > 0:
        limit = min(limit, max(h.max_in_flight, int(h.lease * LEASE_SHARE / h.send_s * h.max_in_flight)))
    return limit


def claim_count(h: Holding, *, with_batch: bool = False) -> int:
    """How many to claim now, 0 for none. ``with_batch``: in the transaction that records a batch of
    attempts (after a claim that found every row taken, only there)."""
    if h.paused or (h.missed and not with_batch):
        return 0
    if h.ready > h.ahead // 2:  # claim in batches, before the queue runs dry
        return 0
    return max(0, hold_limit(h) - h.inflight - h.ready)


@dataclass(frozen=True)
class AfterClaim:
    """What a claim's answer means (``after_claim``)."""

    backlog: bool
    """Keep claiming ahead (the recorder refills the queue); False: back to the loop's alarm."""
    ahead: int
    """The run-ahead for the next claims."""
    missed: bool
    """It found every due row taken by others: claim again only with the next recorded batch."""


def after_claim(got: int, wanted: int, *, more_due: bool, busy: bool, max_in_flight: int) -> AfterClaim:
    """A claim that asked for ``wanted`` took ``got``. A backlog while it got all it asked for, or more
    was due than it asked for (``more_due``: the rows it missed went to other processes claiming at the
    same moment, and the next claim finds others) and it got some or has deliveries under way
    (``busy``: the next claim then goes with their recording, not at once)."""
    backlog = got >= wanted or (more_due and (got > 0 or busy))
    return AfterClaim(backlog, AHEAD_PER_SENDER * max_in_flight if backlog else 0, backlog and got == 0)


# ---- per target (issue 42) ---------------------------------------------------------------------------
#
# Each target has its own send slots (a lane: ``delivery.holdings``), so a target whose sends hang holds
# only its own. A claim asks each target in use for its own room, and leaves a target with no room out
# of the query; the targets not in use share the room of a fresh lane.


@dataclass(frozen=True)
class Plan:
    """How many to claim now (``want``, 0 for none), at most ``rooms`` per target in use and ``other``
    per target not in use (``store.claims.TargetRoom``)."""

    want: int
    rooms: tuple[tuple[str, int], ...] = ()
    other: int = 0


REFILL_SOON = 1.0
"""Seconds: a lane whose queue should run down to its refill point within this long (at its send time
so far) holds every claim back until it does, so that one claim serves it and the others; a lane
slower than that (a target that hangs) holds back no other target's claims."""


def lane_room(h: Holding) -> int | None:
    """A lane's room for a claim now; None while it waits to claim in a batch (its queue runs ahead of
    its senders by more than half the run-ahead: the backlog refills it when it runs low, soon)."""
    if h.ready > h.ahead // 2:
        soon = h.send_s <= 0 or (h.ready - h.ahead // 2) * h.send_s / h.max_in_flight <= REFILL_SOON
        return None if soon else 0
    return max(0, hold_limit(h) - h.inflight - h.ready)


def plan_claim(lanes: dict[str, Holding], fresh: Holding, *, with_batch: bool = False) -> Plan:
    """The claim over several lanes: ``lanes``, the targets with claims held (ready, in flight or being
    recorded); ``fresh``, a target with nothing held (and the executor's pause and missed state).

    The lanes in use with room ask for it; a full lane (its senders all busy: a target that hangs) is
    left out and asks for nothing. When no lane in use has room and none waits for a batch, the claim
    asks for the other targets alone (``fresh``'s room): so targets nobody sends to now are claimed
    while every lane in use is full, and never when one of them is about to refill in a batch (that
    claim comes soon, and takes them too). Never more than ``fresh``'s hold limit at once (the query's
    size), whatever the number of lanes."""
    if fresh.paused or (fresh.missed and not with_batch):
        return Plan(0)
    rooms: dict[str, int] = {}
    batching = False
    for name, h in lanes.items():
        room = lane_room(h)
        batching = batching or room is None
        rooms[name] = room or 0
    new = hold_limit(fresh)
    wanted = sum(rooms.values())
    if wanted <= 0:
        wanted = 0 if batching else new
    return Plan(min(wanted, new), tuple(sorted(rooms.items())), new)
