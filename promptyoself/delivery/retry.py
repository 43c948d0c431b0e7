"""The retry policy of deliveries, pure (no I/O, no clock): which failures are retried, how long to
wait (exponential backoff with jitter, a server's Retry-After honoured), when to give up (a deadline:
the missed-run grace after the intended time, not an attempt count), and how long to pause every
delivery while Letta refuses the credentials."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import timedelta

from promptyoself.config import Settings
from promptyoself.errors import (
    WRITTEN_AFTER,
    AgentNotFound,
    InvalidArgument,
    NotSent,
    PromptYoSelfError,
    StillPending,
    TargetAuth,
    TargetGone,
    TargetRejected,
    TargetUnavailable,
)
from promptyoself.timing import format_duration

MAX_RETRY_AFTER = 600.0
"""A server's Retry-After is honoured up to this many seconds by default (``PROMPTYOSELF_RETRY_AFTER_MAX``,
10 minutes): a ``Retry-After: 100000`` must not defer a prompt by a day."""
AUTH_PREFIXES = ("target_auth:", "letta_auth:")
"""How history's error text starts for a refused credential: the target-neutral code, or a target's own."""
UNAVAILABLE_PREFIXES = ("target_unavailable", "letta_unavailable")
"""Likewise for a target that could not be reached (the outage probe resumes these at once)."""
IN_DOUBT_PREFIX = "in_doubt: "
"""Starts the error of an attempt whose outcome is unknown (the request may have reached Letta): the
next attempt on the occurrence asks Letta for its ``otid`` before sending."""
FENCED = "claim lost or past its deadline; not sent"


def error_text(exc: BaseException) -> str:
    """An error as history and results show it: ``code: message`` (``internal: ...`` for a bug)."""
    if isinstance(exc, PromptYoSelfError):
        return f"{exc.code}: {exc.message}"
    return f"internal: {type(exc).__name__}: {str(exc)[:300]}"


def _doubt(in_doubt: bool) -> str:
    return IN_DOUBT_PREFIX if in_doubt else ""


@dataclass(frozen=True)
class Decision:
    """``RetryPolicy.decide``'s answer: ``kind`` (released | paused | retry | failed), the seconds
    before the next attempt (``retry``), the error text to record, and whether it was an auth refusal
    (every delivery then pauses)."""

    kind: str
    delay: float | None = None
    text: str = ""
    auth: bool = False


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: ``base * 2**(attempt-1)`` capped at ``cap``, then a random
    point in its upper half (so retries from many schedules spread out but never come early)."""
    step = min(cap, base * (2 ** max(0, min(attempt - 1, 60))))
    return step / 2 + (rng or random).uniform(0, step / 2)


@dataclass(frozen=True)
class RetryPolicy:
    """``base``/``cap``: backoff seconds (``PROMPTYOSELF_RETRY_BASE``/``_MAX``); ``max_attempts``:
    transient attempts on one occurrence before it is ``failed`` (``PROMPTYOSELF_MAX_ATTEMPTS``; None,
    the default: no count); ``grace``: seconds after an occurrence's intended time until which a
    transient failure is retried (``PROMPTYOSELF_MISFIRE_GRACE``): an outage costs time, not attempts,
    so a Letta down for 30 minutes loses nothing; ``settle``: the least wait after an attempt whose
    request may still be inside Letta (a timeout or reset after it was written), so that such a
    request has landed (or died) before the next attempt asks Letta for it: the client's own timeout
    (``PROMPTYOSELF_LETTA_TIMEOUT``)."""

    base: float
    cap: float
    max_attempts: int | None = None
    rng: random.Random = field(default_factory=random.Random, compare=False)
    settle: float = 0.0
    grace: float = float("inf")
    retry_after_max: float = MAX_RETRY_AFTER

    @classmethod
    def of(cls, settings: Settings, rng: random.Random) -> RetryPolicy:
        """The policy the settings ask for (the client's timeout is the settle time)."""
        return cls(settings.retry_base, settings.retry_max, settings.max_attempts, rng,
                   settle=settings.letta_timeout, grace=settings.misfire_grace.total_seconds(),
                   retry_after_max=settings.retry_after_max)

    def decide(self, exc: BaseException, attempt: int, *, late: float, in_doubt: bool,
               counted_attempts: int | None = None) -> Decision:
        """What a failed send of attempt ``attempt`` means, for an occurrence ``late`` seconds past its
        intended time (``in_doubt``: an earlier attempt may have reached the agent):

        - ``released``: the claim's fence said no before the request was written (``NotSent``);
        - ``paused``: the agent is gone or our request is rejected: stop until someone looks;
        - ``retry`` after a backoff: credentials refused (never given up: they wait for a fix) or a
          transient failure, a server's Retry-After honoured, at least ``settle`` when the request may
          still be landing inside the target; an unexpected error counts as transient and in doubt;
        - ``failed``: the target refused this occurrence for good (``TargetRejected``), or a transient
          failure past the deadline (``grace``) or ``max_attempts`` attempts
          (``counted_attempts``: those that count, auth refusals left out; default ``attempt``).

        The error text starts with ``IN_DOUBT_PREFIX`` while the outcome of some attempt is unknown, so
        that the next attempt asks the target for the message before sending it again."""
        if isinstance(exc, NotSent):
            return Decision("released", text=FENCED)
        text = error_text(exc)
        if isinstance(exc, AgentNotFound | InvalidArgument | TargetGone):
            return Decision("paused", text=text)
        if isinstance(exc, TargetRejected):  # this occurrence is refused for good; a recurring one moves on
            return Decision("failed", text=text)
        if isinstance(exc, TargetAuth):
            return Decision("retry", delay=self.delay(attempt), text=_doubt(in_doubt) + text, auth=True)
        retry_after: object = None
        written_after = 0.0
        if isinstance(exc, TargetUnavailable):
            retry_after = exc.details.get("retry_after")
            in_flight = bool(exc.details.get("in_doubt"))  # this request may still be inside the target
            late_write = exc.details.get(WRITTEN_AFTER)
            if isinstance(late_write, int | float) and not isinstance(late_write, bool) and late_write > 0:
                written_after = float(late_write)
        else:  # nothing sent (StillPending), or a bug or an unexpected answer: transient, in doubt
            in_flight = not isinstance(exc, StillPending)
        text = _doubt(in_flight or in_doubt) + text
        if self.gives_up(attempt if counted_attempts is None else counted_attempts, late):
            why = (f"PROMPTYOSELF_MAX_ATTEMPTS={self.max_attempts}" if self.remaining(late) > 0
                   else f"{format_duration(timedelta(seconds=late))} late, PROMPTYOSELF_MISFIRE_GRACE="
                   f"{timedelta(seconds=self.grace)}")
            return Decision("failed", text=f"{text} (gave up after {attempt} attempts, {why})")
        return Decision("retry", delay=self.delay(attempt, retry_after, in_flight=in_flight, late=late,
                                                  written_after=written_after), text=text)

    def delay(self, attempt: int, retry_after: object = None, *, in_flight: bool = False,
              late: float | None = None, written_after: float = 0.0) -> float:
        """Seconds before attempt ``attempt + 1``: the backoff, or the server's Retry-After if longer
        (at most ``retry_after_max``, PROMPTYOSELF_RETRY_AFTER_MAX);
        at least ``settle`` when the request may still be in flight inside Letta (``in_flight``), plus
        ``written_after``, the seconds the request waited for its write (a slow connect) within the
        client's timeout. With ``late`` (seconds since the occurrence's intended time), never past the
        deadline: the last try comes just before ``grace`` (``remaining``), not a backoff step after it."""
        delay = backoff_delay(attempt, self.base, self.cap, self.rng)
        if isinstance(retry_after, int | float) and not isinstance(retry_after, bool) and retry_after > 0:
            delay = max(delay, min(float(retry_after), self.retry_after_max))
        if late is not None:
            delay = max(min(delay, self.remaining(late)), 0.0)
        if in_flight:  # the settle time counts from the write: the client's timeout ran from before it
            delay = max(delay, self.settle + written_after)
        return delay

    def gives_up(self, counted_attempts: int, late: float = 0.0) -> bool:
        """True when the occurrence is ``late`` seconds past its intended time and that is the
        deadline (``grace``), or when ``counted_attempts`` transient attempts (auth errors not
        counted) reach ``max_attempts`` where one is set."""
        if self.remaining(late) <= 0:
            return True
        return self.max_attempts is not None and counted_attempts >= self.max_attempts

    def remaining(self, late: float) -> float:
        """Seconds left for retries of an occurrence ``late`` seconds past its intended time: up to a
        margin before ``grace`` (1 %, at most a minute), so that the last try is a send, not the
        ``missed`` a one-time prompt beyond the grace gets."""
        return self.grace - min(60.0, self.grace * 0.01) - late

    def auth_pause(self, streak: int) -> float:
        """How long every delivery pauses after the ``streak``-th refusal of the credentials in a row."""
        return backoff_delay(streak, self.base, self.cap, self.rng)
