"""Small exception tree. Each error carries a stable ``code`` and a message that says what to do next.

The MCP layer turns these into ``{"status": "error", "error": msg, "code": code}`` tool errors and the
CLI turns them into exit code 1 with the same JSON on stdout.
"""

from __future__ import annotations

from typing import Any, ClassVar


class PromptYoSelfError(Exception):
    """Base of every error the core raises on purpose."""

    code: ClassVar[str] = "internal"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": "error", "error": self.message, "code": self.code}
        out.update(self.details)
        return out


class InvalidArgument(PromptYoSelfError):
    code = "invalid_argument"


class InvalidTime(InvalidArgument):
    code = "invalid_time"


class TimeInPast(InvalidArgument):
    code = "time_in_past"


class InvalidCron(InvalidArgument):
    code = "invalid_cron"


class InvalidInterval(InvalidArgument):
    code = "invalid_interval"


class OutOfRange(InvalidArgument):
    """A time, or a run of a schedule, beyond what every timezone can show (the calendar ends with the
    year 9999): ``start_at`` a few seconds before that, a one-time prompt on 9999-12-31."""

    code = "out_of_range"


class AgentRequired(PromptYoSelfError):
    code = "agent_required"


class AgentNotFound(PromptYoSelfError):
    code = "agent_not_found"


class NotFound(PromptYoSelfError):
    code = "not_found"


class Forbidden(PromptYoSelfError):
    """An agent token asked for what only the operator (or another agent) may do: HTTP 403."""

    code = "forbidden"


class Unauthorized(PromptYoSelfError):
    """A credential that is unknown or revoked: HTTP 401."""

    code = "unauthorized"


class QuotaExceeded(PromptYoSelfError):
    """A limit of PromptYoSelf's own: an agent's live schedules (``PROMPTYOSELF_MAX_ACTIVE_PER_AGENT``)."""

    code = "quota_exceeded"


class RateLimited(PromptYoSelfError):
    """An agent made more schedules in the last hour than PROMPTYOSELF_MAX_SCHEDULES_PER_AGENT_PER_HOUR
    allows (a runaway agent scheduling itself from every prompt). ``retry_after_s`` says when one more
    is allowed."""

    code = "rate_limited"


class PromptTooLong(QuotaExceeded):
    """A prompt over ``PROMPTYOSELF_MAX_PROMPT_CHARS`` (same code; the REST API answers 413)."""


class IntervalTooShort(InvalidInterval):
    """An interval under ``PROMPTYOSELF_MIN_INTERVAL`` (the message names the minimum; the REST API
    answers 422)."""

    code = "interval_too_short"


class BadNumber(InvalidArgument):
    """A number of the wrong kind: NaN or Infinity, a boolean where a number is meant, a fraction
    where an integer is (same code as any bad argument; the REST API answers 422, as FastAPI does for
    any value that does not fit its type)."""


class IdempotencyConflict(PromptYoSelfError):
    """An idempotency key reused with other arguments: the key names the first request, which is
    not what this one asks for (a retry sends the same arguments)."""

    code = "idempotency_conflict"


class TargetUnavailable(PromptYoSelfError):
    """A target could not take the prompt now (connect error, timeout, 5xx, 429, a turn that failed):
    transient, retried. ``details["in_doubt"]`` when the request may have arrived, ``details["retry_after"]``
    in seconds when the receiver asked for it. A target's own subclass may carry its own code (the
    Letta client's ``letta_unavailable``)."""

    code = "target_unavailable"


WRITTEN_AFTER = "written_after"
"""``TargetUnavailable.details[WRITTEN_AFTER]``: for a request that may still be inside the target, the
seconds from its start until its first byte was written. The client's timeout counts from the start
(a connect included), so the target had that much less of it: the next attempt waits that much longer
(``RetryPolicy.decide``)."""


class TargetAuth(PromptYoSelfError):
    """The target refused our credentials (401/403): delivery backs off and health shows it."""

    code = "target_auth"


class StillPending(PromptYoSelfError):
    """An occurrence in doubt is not in the agent's history yet, but the agent has runs not started
    that may carry it: not sent, looked for again later."""

    code = "still_pending"


class NotSent(PromptYoSelfError):
    """A send's guard (the claim's fence) said no right before its request was written: the server
    never saw it, and the claim is given back."""

    code = "not_sent"


class DatabaseDriverMissing(PromptYoSelfError):
    """The database URL names a driver that is not installed (e.g. psycopg for PostgreSQL)."""

    code = "database_driver_missing"


class DatabaseUnavailable(PromptYoSelfError):
    """The database cannot be opened or reached: refused, unknown host, missing database, a folder
    that cannot be created or written, ..."""

    code = "database_unavailable"


class DatabaseReadOnly(DatabaseUnavailable):
    """The database is read-only: its files (made immutable, a read-only mount, their permissions), a
    PostgreSQL standby or read-only transaction. Nothing can be claimed or recorded until it is
    writable again."""

    code = "database_read_only"


ERROR_CODES: tuple[str, ...] = (
    "invalid_time",
    "time_in_past",
    "invalid_cron",
    "invalid_interval",
    "interval_too_short",
    "out_of_range",
    "invalid_argument",
    "agent_required",
    "agent_not_found",
    "not_found",
    "quota_exceeded",
    "rate_limited",
    "idempotency_conflict",
    "letta_unavailable",
    "letta_auth",
    "target_unavailable",
    "target_auth",
    "database_driver_missing",
    "database_unavailable",
    "database_read_only",
    "internal",
)


class TargetGone(PromptYoSelfError):
    """The receiver says the destination is gone for good (an HTTP 410, an agent session that
    no longer exists): the schedule is paused with the reason."""

    code = "target_gone"


class TargetRejected(PromptYoSelfError):
    """The receiver refused this occurrence for good (an HTTP receiver's other 4xx): the occurrence fails with
    the status in history and a recurring schedule moves on."""

    code = "target_rejected"
