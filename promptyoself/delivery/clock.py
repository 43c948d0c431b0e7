"""The wall clock going back (a VM restored, NTP stepping a clock that ran fast, an operator's
``date -s``): recurring schedules hold their next slot in wall-clock time, so after a jump back of two
hours they would stay silent for two hours. The delivery loop notices the jump (the wall clock moved
less than the monotonic one) and re-arms every recurring schedule from the current time.

A jump ahead (the wall clock moved more than the monotonic one: a clock set a day ahead by mistake) is
noticed too and shown in health for as long as a jump back is (issue 42 finding 12): what is delivered
meanwhile is dated in the future. Nothing is re-armed (the prompts due by the wrong time go out, a
recurring schedule coalesces its runs), and once the clock is right again the budget days ignore the
rows dated after now (``store.day_counts``). The clocks compared are the wall clock and
``CLOCK_BOOTTIME`` where there is one (``steady``): the monotonic clock stops while the machine
sleeps, and a laptop's resume is not a jump ahead."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from promptyoself import timing
from promptyoself.deps import Services
from promptyoself.store.delivery_store import Rearm, RecurringRow

log = logging.getLogger(__name__)

JUMP_S = 30.0
"""A wall clock that fell this many seconds behind the monotonic clock since the last look (or ran this
many ahead of it) has jumped."""


def steady() -> float:
    """Seconds of a clock that no one sets and that counts a machine's sleep (Linux ``CLOCK_BOOTTIME``;
    the monotonic clock elsewhere): what the wall clock is compared with."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()
PAGE = 2000
IO = Callable[..., Awaitable[Any]]


class ClockWatch:
    """``check(wall, mono)`` after each wake of the loop: the seconds the wall clock jumped back since
    the previous call, or None. A jump ahead is kept for health (``jump`` with ``ahead_s``) and logged,
    and ``check`` answers None for it (nothing to re-arm)."""

    def __init__(self) -> None:
        self._last: tuple[datetime, float] | None = None
        self.jump: dict[str, Any] | None = None
        """The last jump back (``{"at", "back_s"}``), for health."""
        self._jump_mono = 0.0

    def check(self, wall: datetime, mono: float) -> float | None:
        last, self._last = self._last, (wall, mono)
        if last is None:
            return None
        behind = (mono - last[1]) - (wall - last[0]).total_seconds()
        if behind < -JUMP_S:
            self.jump, self._jump_mono = {"at": wall.isoformat(), "ahead_s": round(-behind, 3)}, mono
            log.warning("the system clock jumped ahead %.0fs; what is delivered now is dated in the future", -behind)
            return None
        if behind <= JUMP_S:
            return None
        self.jump, self._jump_mono = {"at": wall.isoformat(), "back_s": round(behind, 3)}, mono
        return behind

    def shown(self, mono: float, for_s: float) -> dict[str, Any] | None:
        """The last jump (back or ahead) while it is less than ``for_s`` old (``mono`` from ``steady``)."""
        return self.jump if self.jump is not None and mono - self._jump_mono < for_s else None


async def rearm_recurring(core: Services, now: datetime, io: IO) -> int:
    """Every active recurring schedule whose next slot is later than the first slot after ``now`` (as
    its rule computes it afresh) moves to that slot. Returns how many moved. The store is awaited; the
    rules' slots, up to ``PAGE`` at a time, are computed through ``io`` (off the event loop)."""
    moved = 0
    after = 0
    while True:
        rows = await core.deliveries.recurring_ahead(now, after, PAGE)
        if not rows:
            return moved
        changes: list[Rearm] = await io(_rearmed, rows, now)
        if changes:
            moved += await core.deliveries.rearm(changes, now)
        after = rows[-1][0]


def _rearmed(rows: list[RecurringRow], now: datetime) -> list[Rearm]:
    """The rows (``recurring_ahead``) whose first slot after ``now`` is earlier than their next slot,
    as ``rearm`` takes them."""
    changes = []
    for sid, kind, value, zone, anchor, nxt in rows:
        try:
            fresh, new_anchor = _first_slot_after(kind, value, zone, anchor, nxt, now)
        except Exception:  # a rule this version cannot read: leave it as it is
            log.debug("clock jump: schedule %s not re-armed", sid, exc_info=True)
            continue
        if fresh is not None and fresh < nxt:
            changes.append((sid, nxt, fresh, new_anchor))
    return changes


def _first_slot_after(kind: str, value: str, zone: str, anchor: datetime | None, nxt: datetime,
                      now: datetime) -> tuple[datetime | None, datetime | None]:
    """The schedule's first slot after ``now`` and, for an interval, its anchor moved back onto that
    slot when the slot is before it (run k = anchor + k*every keeps its phase)."""
    if kind == "interval":
        every = timing.parse_interval(value)
        steps = (nxt - now - timedelta(microseconds=1)) // every
        fresh = nxt - steps * every
        return fresh, min(anchor, fresh) if anchor is not None else fresh
    return timing.next_run_after(kind, value, timing.resolve_zone(zone, "UTC"), after=now, anchor=anchor), None
