"""What the delivery loop watches besides the claims, each one explicit state with named transitions
(issue 30 point 2): ``LoopState`` (the engine itself: running, stopping, stopped, failed and why),
``Outage`` (the target stopped answering: probe, then resume the prompts waiting
out a backoff) and ``AuthBackoff`` (the target refused our credentials: pause every send); and what
it counts: ``Totals`` (outcomes, and a drain's results) and ``Drain`` (``execute`` without a loop);
``Gate`` (may a claim be made, or taken for a send, now); and how other threads wake it: ``Wakeup``.
Plain state: the loop asks, the senders and the recorder report outcomes (``Outcomes.count``);
nothing here calls anyone back. ``mono`` is the caller's monotonic time (tests pass their own)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from promptyoself.delivery.retry import UNAVAILABLE_PREFIXES

log = logging.getLogger("promptyoself.delivery.engine")

async def wait_event(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait for ``event`` up to ``seconds`` (None: no limit); True if it was set. Through
    ``asyncio.timeout``: Python 3.11's ``asyncio.wait_for`` loses a cancellation that arrives as the
    event is set (gh-86296), and a task of the engine cancelled at shutdown must end."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


OutageState = Literal["up", "down", "probed"]
Phase = Literal["stopped", "running", "stopping", "failed"]


@dataclass
class LoopState:
    """The engine's phase. ``stopped`` -> (``start``) ``running`` -> (``stop``: claim no more, give
    back what is unsent, let the sends in flight finish) ``stopping`` -> (``ended``) ``stopped``; any
    phase -> (``failed``: a part of the engine died) ``failed``, with ``why``. A stop asked before the
    run starts (a signal in that instant) holds: ``start`` leaves ``stopping`` as it is, and the run
    ends at once. Read from any thread (one attribute at a time); changed by the loop, and by
    ``stop`` from any thread."""

    phase: Phase = "stopped"
    why: str | None = None

    def start(self) -> None:
        if self.phase != "stopping":
            self.phase, self.why = "running", None

    def stop(self) -> None:
        if self.phase in ("running", "stopped"):
            self.phase = "stopping"

    def ended(self) -> None:
        if self.phase != "failed":
            self.phase = "stopped"

    def failed(self, why: str) -> None:
        self.phase, self.why = "failed", why

    def is_set(self) -> bool:
        """Stopping (or stopped): what ``attempt`` asks of its ``stopping`` (a ``threading.Event``'s test)."""
        return self.phase != "running"


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
class Outcomes:
    """What an attempt's outcome changes: the totals, the credentials' pause (``auth``), the outage.
    ``count`` is told each result (on the loop); when the outage's state changed it sets ``changed``
    (the engine's outage probe looks again) and answers True."""

    totals: Totals
    auth: AuthBackoff
    outage: Outage
    pause_for: Callable[[int], float]
    changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)

    def count(self, res: Any) -> bool:
        outage_was = (self.outage.state, self.outage.resume_pending)
        with self.totals.lock:
            self.totals.count(res.outcome, res)
            if res.auth_error:
                pause = self.auth.refused(res.error, self.pause_for, time.monotonic())
                log.error("Letta refused the credentials; pausing deliveries for %.1fs: %s", pause, res.error)
            elif res.outcome == "delivered":
                self.auth.delivered()
            if res.outcome == "retry" and any(p in (res.error or "") for p in UNAVAILABLE_PREFIXES):
                self.outage.send_failed(time.monotonic())
            elif res.outcome == "delivered":
                self.outage.delivered()
        level = logging.INFO if res.outcome in ("delivered", "released", "queued") else logging.WARNING
        log.log(level, "schedule %s -> %s (attempt %s)%s", res.schedule_id, res.outcome, res.attempt,
                f": {res.error}" if res.error else "")
        if (self.outage.state, self.outage.resume_pending) == outage_was:
            return False
        self.changed.set()
        return True


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


@dataclass
class Gate:
    """May a claim be made, or taken for a send, now? Read by the holdings from the loop's state."""

    state: LoopState
    auth: AuthBackoff
    drain: Drain | None = None
    mono: Callable[[], float] = time.monotonic

    def may_send(self) -> bool:
        """Not stopping (those claims are released), credentials not refused."""
        return not self.state.is_set() and self.auth.wait(self.mono()) <= 0

    def may_claim(self) -> bool:
        """A sender could take it, and a drain's budget is not spent."""
        return self.may_send() and not (self.drain is not None and self.drain.out_of_time(self.mono()))


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
        if not await wait_event(event, seconds):
            return False
        event.clear()
        return True


@dataclass
class Round:
    """The delivery loop's alarm from one round to the next (``delivery.alarm``): when it read the
    earliest due time and what it found, and whether it must read it again now (``asked``), poll a
    backlog that other processes share (``contended``), or may sleep until that time."""

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
    last_tick: datetime | None = None
    """The wall-clock time of the last read (health)."""

    def asked(self) -> None:
        """Something changed what is due (a write, a delivery, the outage's end, the clock going back)."""
        self.must_read = True

    def due(self, mono: float, interval: float) -> bool:
        return self.must_read or mono - self.read_at >= interval

    def read(self, earliest: datetime | None, complete: bool, mono: float, now: datetime) -> None:
        self.earliest, self.complete, self.read_at, self.last_tick = earliest, complete, mono, now
        self.must_read = False
        if earliest is None or earliest > now:
            self.contended = False

    def claimed(self, got: bool, full: bool, first_poll: float, max_poll: float) -> None:
        """A claim came back: full (a backlog, the recorder goes on), or short. Short with some got:
        read the next alarm at once. Short at all: other processes took the rows; poll them, sooner
        while claims still find some, each empty one doubling the wait up to ``max_poll``."""
        self.must_read = not full and got
        self.contended = not full
        self.poll_s = first_poll if got else min(self.poll_s * 2, max_poll)
