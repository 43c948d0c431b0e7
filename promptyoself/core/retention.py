"""Retention (issue 42 item 6): ended schedules (cancelled, completed, failed) are deleted, with their
history, ``PROMPTYOSELF_KEEP_ENDED`` after their last change; history rows ``PROMPTYOSELF_KEEP_HISTORY``
after their attempt. ``promptyoself purge`` runs it (``--before`` for one cut-off of its own), and the
service runs it once an hour (promptyoself.faces.http). The cut-offs are decided here (pure); the
deleting is the store interface's ``purge`` verb, awaited (``core.deliveries``: the database's or
memory's)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from promptyoself import timing
from promptyoself.errors import InvalidArgument, PromptYoSelfError

if TYPE_CHECKING:
    from promptyoself.deps import Services

log = logging.getLogger(__name__)

HISTORY_FLOOR = timedelta(days=2)
"""History younger than this (or than ``PROMPTYOSELF_MISFIRE_GRACE``, if longer) is never purged: the
day's budget and the retries of an occurrence still being delivered read it."""
EVERY = 3600.0
"""Seconds between the service's purges."""


def cut_off(value: object, now: datetime) -> datetime:
    """``--before``: a duration ago (``30d``, ``12h``, ``P1W``) or an ISO 8601 date or date-time (UTC
    unless it names an offset); ``InvalidArgument`` otherwise, or for a time in the future."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument("before must be a duration ago such as 30d, or an ISO date such as 2026-01-31.")
    text = value.strip()
    try:
        when = now - timing.parse_interval(text)
    except PromptYoSelfError:
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidArgument(f"before must be a duration ago such as 30d, or an ISO date such as 2026-01-31; "
                                  f"got {text[:40]!r}.") from None
        when = parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    if when > now:
        raise InvalidArgument(f"before ({text[:40]}) is in the future; nothing that old could be purged.")
    return when


async def purge(core: Services, *, before: object = None, now: datetime | None = None) -> dict[str, Any]:
    """Delete what retention lets go: with ``before``, ended schedules and history older than it;
    without, by ``PROMPTYOSELF_KEEP_ENDED`` and ``PROMPTYOSELF_KEEP_HISTORY`` (``off``: kept). History
    within ``HISTORY_FLOOR`` (or the misfire grace) of now is always kept."""
    now = now or core.now()
    settings = core.settings
    ended: datetime | None
    history: datetime | None
    if before is not None:
        ended = history = cut_off(before, now)
    else:
        ended = now - settings.keep_ended if settings.keep_ended is not None else None
        history = now - settings.keep_history if settings.keep_history is not None else None
    floor = now - max(HISTORY_FLOOR, settings.misfire_grace)
    if history is not None:
        history = min(history, floor)
    done = await core.deliveries.purge(ended, history)
    if done.schedules or done.history or done.passthrough:
        log.info("purged %d ended schedule(s) and %d history row(s) (retention)", done.schedules, done.history)
    return {"status": "success", "schedules": done.schedules, "history": done.history,
            "passthrough_sends": done.passthrough,
            "ended_before": timing.to_utc_iso(ended) if ended is not None else None,
            "history_before": timing.to_utc_iso(history) if history is not None else None}
