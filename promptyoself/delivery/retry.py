"""The retry policy of deliveries, pure (no I/O, no clock): which failures are retried, how long to
wait (exponential backoff with jitter, a server's Retry-After honoured), when to give up, and how long
to pause every delivery while Letta refuses the credentials."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from promptyoself.errors import (
    AgentNotFound,
    InvalidArgument,
    LettaAuth,
    LettaUnavailable,
)

MAX_RETRY_AFTER = 86400.0
"""A server's Retry-After is honoured up to a day."""


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: ``base * 2**(attempt-1)`` capped at ``cap``, then a random
    point in its upper half (so retries from many schedules spread out but never come early)."""
    step = min(cap, base * (2 ** max(0, min(attempt - 1, 60))))
    return step / 2 + (rng or random).uniform(0, step / 2)


@dataclass(frozen=True)
class RetryPolicy:
    """``base``/``cap``: backoff seconds (``PROMPTYOSELF_RETRY_BASE``/``_MAX``); ``max_attempts``:
    transient attempts on one occurrence before it is ``failed`` (``PROMPTYOSELF_MAX_ATTEMPTS``);
    ``settle``: the least wait after an attempt whose request may still be inside Letta (a timeout or
    reset after it was written), so that such a request has landed (or died) before the next attempt
    asks Letta for it: the client's own timeout (``PROMPTYOSELF_LETTA_TIMEOUT``)."""

    base: float
    cap: float
    max_attempts: int
    rng: random.Random = field(default_factory=random.Random, compare=False)
    settle: float = 0.0

    @staticmethod
    def kind(exc: BaseException) -> str:
        """What a send's failure means: ``paused`` (the agent is gone or our request is rejected:
        stop until someone looks), ``auth`` (wait for credentials, never give up), ``transient``
        (retry with backoff, up to ``max_attempts``). Anything unexpected counts as transient."""
        if isinstance(exc, AgentNotFound | InvalidArgument):
            return "paused"
        if isinstance(exc, LettaAuth):
            return "auth"
        if isinstance(exc, LettaUnavailable):
            return "transient"
        return "transient"

    def delay(self, attempt: int, retry_after: object = None, *, in_flight: bool = False) -> float:
        """Seconds before attempt ``attempt + 1``: the backoff, or the server's Retry-After if longer;
        at least ``settle`` when the request may still be in flight inside Letta (``in_flight``)."""
        delay = backoff_delay(attempt, self.base, self.cap, self.rng)
        if isinstance(retry_after, int | float) and not isinstance(retry_after, bool) and retry_after > 0:
            delay = max(delay, min(float(retry_after), MAX_RETRY_AFTER))
        if in_flight:
            delay = max(delay, self.settle)
        return delay

    def gives_up(self, counted_attempts: int) -> bool:
        """True when ``counted_attempts`` transient attempts (auth errors not counted) are the limit."""
        return counted_attempts >= self.max_attempts

    def auth_pause(self, streak: int) -> float:
        """How long every delivery pauses after the ``streak``-th refusal of the credentials in a row."""
        return backoff_delay(streak, self.base, self.cap, self.rng)
