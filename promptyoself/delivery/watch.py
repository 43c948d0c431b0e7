"""What the delivery loop watches besides the claims, each one explicit state with named transitions
(issue 30 point 2): ``Outage`` (the target stopped answering: probe, then resume the prompts waiting
out a backoff) and ``AuthBackoff`` (the target refused our credentials: pause every send); and what
it counts: ``Totals`` (outcomes, and a drain's results) and ``Drain`` (``execute`` without a loop);
and how other threads wake it: ``Wakeup``. Plain
state: the loop asks, the senders and the recorder report through ``Executor._account``; nothing here
calls anyone back. ``mono`` is the caller's monotonic time (tests pass their own)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

OutageState = Literal["up", "down", "probed"]


@dataclass
class Outage:
    """``up`` -> (a transient send failure) ``down``: a probe every ``every`` seconds -> (a probe
    answered) ``probed``: the waiting prompts resumed once; later only a delivery ends it -> (a
    delivery) ``up``. A delivery or a probe that answered leaves one resume pending
    (``take_resume``): the prompts waiting out a backoff are made due at once."""

    every: float
    state: OutageState = "up"
    probe_at: float = 0.0
    resume_pending: bool = False

    def send_failed(self, mono: float) -> None:
        if self.state == "up":
            self.state, self.probe_at = "down", mono + self.every

    def delivered(self) -> None:
        if self.state != "up":
            self.state, self.resume_pending = "up", True

    def probe_due(self, mono: float) -> bool:
        """A probe is due now; the next one is then ``every`` later (whatever this one answers)."""
        if self.state != "down" or mono < self.probe_at:
            return False
        self.probe_at = mono + self.every
        return True

    def probe_answered(self) -> None:
        if self.state == "down":
            self.state, self.resume_pending = "probed", True

    def take_resume(self) -> bool:
        pending, self.resume_pending = self.resume_pending, False
        return pending

    def watching(self) -> bool:
        """The loop has something to do for the outage (a probe to make, or a resume pending)."""
        return self.state != "up" or self.resume_pending

    def wake_in(self, mono: float) -> float | None:
        """Seconds until the next probe, while one is to come."""
        return self.probe_at - mono if self.state == "down" else None


@dataclass
class AuthBackoff:
    """``ok`` -> (refused, ``pause`` seconds) ``paused until`` -> (a delivery) ``ok``. The streak of
    refusals in a row sets the pause (``RetryPolicy.auth_pause``); ``error`` is shown in health."""

    streak: int = 0
    until: float = 0.0
    error: str | None = None

    def refused(self, error: str | None, pause_for: Callable[[int], float], mono: float) -> float:
        """One more refusal in a row: pause ``pause_for(streak)`` seconds from ``mono``; the pause."""
        self.streak += 1
        pause = pause_for(self.streak)
        self.error, self.until = error, mono + pause
        return pause

    def delivered(self) -> None:
        if self.streak:
            self.streak, self.error, self.until = 0, None, 0.0

    def wait(self, mono: float) -> float:
        """Seconds every send still waits (<= 0: none)."""
        return self.until - mono


@dataclass
class Totals:
    """The outcomes this executor has seen (``info``), and, while draining, each ``Result``."""

    delivered: int = 0
    failed: int = 0
    retried: int = 0
    missed: int = 0
    results: list[Any] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, outcome: str, result: Any) -> None:
        """(Under ``lock``, held by the caller.)"""
        if self.results is not None:
            self.results.append(result)
        if outcome == "delivered":
            self.delivered += 1
        elif outcome in ("failed", "paused"):
            self.failed += 1
        elif outcome == "retry":
            self.retried += 1
        elif outcome == "missed":
            self.missed += 1


@dataclass
class Drain:
    """``execute`` without ``--loop``: claim only what was due at ``cutoff``, until ``deadline``
    (monotonic seconds)."""

    cutoff: datetime
    deadline: float

    def claim_now(self, now: datetime) -> datetime:
        return min(now, self.cutoff)

    def out_of_time(self, mono: float) -> bool:
        return mono >= self.deadline


class Wakeup:
    """How the loop is woken from other threads: ``wake`` (this process wrote a schedule: re-read the
    earliest due time) and ``nudge`` (a sender or the recorder: look again; one wake-up until the
    loop has looked, ``looked``). ``sleep`` waits on the event loop ``bind`` gave."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._nudged = False
        self._reread = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop, self._event = loop, asyncio.Event()

    def unbind(self) -> None:
        self._event = None

    def wake(self) -> None:
        self._reread = True
        self._signal()

    def nudge(self) -> None:
        if not self._nudged:
            self._nudged = True
            self._signal()

    def looked(self) -> bool:
        """The loop starts a round: the pending nudge is spent; True when a re-read was asked."""
        self._nudged = False
        reread, self._reread = self._reread, False
        return reread

    def _signal(self) -> None:
        loop, event = self._loop, self._event
        if loop is None or event is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(event.set)

    async def sleep(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True if woken early."""
        event = self._event
        assert event is not None
        if event.is_set():
            event.clear()
            return True
        if seconds <= 0:
            return False
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except TimeoutError:
            return False
        event.clear()
        return True


@dataclass
class Round:
    """The delivery loop's own state from one round to the next (``Executor._loop_body``)."""

    earliest: datetime | None = None
    """The earliest due time, as last read."""
    read_at: float = float("-inf")
    """When it was read (monotonic seconds)."""
    must_read: bool = True
    """Read it again at the start of the next round (a write, a delivery, a claim that came back short)."""
    complete: bool = False
    """The last read left no agent out (nothing was held then): a drain may trust ``earliest``."""
    contended: bool = False
    """The last claim came back short while rows were due (other processes took them): poll."""
    poll_s: float = 0.0
    """The contended loop's next look, doubled per claim that finds nothing."""
