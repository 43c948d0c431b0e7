"""The missed-run rule of a schedule (its ``catch_up`` policy): pure, given the slots and ``now``.

Delivery (``delivery/attempt.py``) asks it when a claimed slot is due: which slot to send now, and
which slots to record as ``missed`` in history. The slots come from ``timing.next_run_after``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

CATCH_UP_POLICIES = ("skip", "latest", "all")
ON_TIME = timedelta(seconds=60)
"""A slot delivered later than this is late (the envelope says so); ``skip`` records it missed."""
CATCH_UP_ALL_MAX = 10
"""``all`` delivers at most this many missed slots (the most recent ones within the grace)."""
MAX_MISSED_ROWS = 100
"""At most this many missed slots are recorded as history rows per catch-up (the count is exact)."""
_MAX_DUE_SLOTS = 1000


@dataclass(frozen=True)
class CatchUp:
    """What to do with a claimed slot that is due: ``deliver`` is the slot to send now (the claimed
    one, a later one to skip to, or None: nothing), ``missed`` the slots recorded as missed (oldest
    first, at most ``MAX_MISSED_ROWS``), ``total_missed`` how many there are (at least that many
    when ``more``)."""

    deliver: datetime | None
    missed: tuple[datetime, ...]
    total_missed: int
    more: bool = False


def _slots(begin: datetime, now: datetime, following: Callable[[datetime], datetime | None]) -> list[datetime]:
    """The slots after ``begin`` up to ``now`` (at most ``_MAX_DUE_SLOTS``)."""
    out: list[datetime] = []
    at = begin
    while len(out) < _MAX_DUE_SLOTS:
        nxt = following(at)
        if nxt is None or nxt > now:
            break
        out.append(nxt)
        at = nxt
    return out


def catch_up(
    policy: str,
    first: datetime,
    now: datetime,
    grace: timedelta,
    following: Callable[[datetime], datetime | None],
) -> CatchUp:
    """The missed-run rule for the claimed slot ``first`` (<= ``now``); ``following(slot)`` is the
    schedule's next slot (None when it has no more). The due slots are ``first`` and those after it
    up to ``now``:

    * ``skip``: only a slot less than ``ON_TIME`` late is sent (the latest due one); the rest missed.
    * ``latest`` (default): one run for everything missed, when the latest due slot is within the
      grace: ``first`` is sent (its otid keys the occurrence) and the later due slots are recorded
      missed, coalesced into it. Beyond the grace nothing is sent.
    * ``all``: every due slot within the grace, oldest first, at most ``CATCH_UP_ALL_MAX`` (the most
      recent ones); older ones missed.
    """
    head = [first, *_slots(first, now, following)]
    more = len(head) > _MAX_DUE_SLOTS
    recent = head
    if more:  # a long outage: the recent slots, read from a window before now, not from ``first``
        windows = (grace,) if policy == "all" else (ON_TIME, timedelta(hours=1), grace)
        for window in windows:
            found = _slots(max(head[-1], now - window), now, following)
            if found:
                recent = found
                break
    latest = recent[-1]
    if policy == "skip":
        keep = [latest] if now - latest < ON_TIME else []
    elif policy == "all":
        keep = [s for s in recent if now - s <= grace][-CATCH_UP_ALL_MAX:]
    else:
        keep = [latest] if now - latest <= grace else []
        if keep:
            return CatchUp(first, tuple(head[1 : MAX_MISSED_ROWS + 1]), len(head) - 1, more)
    deliver = keep[0] if keep else None
    missed = [s for s in head if deliver is None or s < deliver]
    return CatchUp(deliver, tuple(missed[:MAX_MISSED_ROWS]), len(missed), more and deliver not in head)
