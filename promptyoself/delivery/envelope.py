"""The text an agent reads: one header line (schedule id, rule, timezone, lateness if late), then the
prompt (``envelope``). Pure."""

from __future__ import annotations

from datetime import datetime, timedelta

from promptyoself import timing
from promptyoself.errors import PromptYoSelfError
from promptyoself.store.records import ScheduleRow

LATE_AFTER = timedelta(seconds=60)
"""A delivery at least this late says so in its envelope."""
MAX_COUNTED_SLOTS = 1000
"""Counting the cron slots a catch-up coalesces stops here ("1000+")."""


def slot_of(claim: ScheduleRow) -> datetime:
    """The occurrence a claimed schedule is sent for: its ``next_run`` (a claim always has one)."""
    if claim.next_run is None:
        raise ValueError(f"schedule {claim.id} has no next_run: it is not a claimed occurrence")
    return claim.next_run


def rule_text(claim: ScheduleRow) -> str:
    if claim.schedule_type == "once":
        return "one-time"
    if claim.schedule_type == "cron":
        return f"cron '{claim.schedule_value}'"
    if claim.schedule_type == "rrule":
        return f"rule '{claim.schedule_value}'"
    try:
        return f"every {timing.format_duration(timing.parse_interval(claim.schedule_value))}"
    except PromptYoSelfError:
        return f"every {claim.schedule_value}"


def slots_up_to(claim: ScheduleRow, now: datetime) -> tuple[int, bool]:
    """How many of the schedule's slots fall in ``[next_run, now]`` (>= 1), and whether the count
    was cut off at ``MAX_COUNTED_SLOTS``. A catch-up delivery coalesces all of them."""
    due = slot_of(claim)
    if claim.schedule_type == "once" or now <= due:
        return 1, False
    try:
        if claim.schedule_type == "interval":
            every = timing.parse_interval(claim.schedule_value)
            return 1 + (now - due) // every, False
        tz = timing.resolve_zone(claim.timezone, "UTC")
        count, at = 1, due
        while count < MAX_COUNTED_SLOTS:
            nxt = timing.next_run_after(claim.schedule_type, claim.schedule_value, tz, after=at, anchor=claim.anchor)
            if nxt is None or nxt > now:
                return count, False
            at = nxt
            count += 1
        return count, True
    except PromptYoSelfError:
        return 1, False


def envelope(claim: ScheduleRow, now: datetime, message_format: str = "annotated") -> str:
    """The text sent to the agent: one header line (schedule id, rule, timezone, lateness if late),
    then the prompt. ``plain`` sends the prompt alone."""
    if message_format == "plain":
        return claim.prompt_text
    tz = timing.resolve_zone(claim.timezone, "UTC")
    header = f"[PromptYoSelf] Scheduled prompt #{claim.id} ({rule_text(claim)}, timezone {tz.key})"
    due = slot_of(claim)
    late = now - due
    if late >= LATE_AFTER:
        header += (
            f" - late by {timing.format_duration(late)}: it was due "
            f"{timing.to_local_iso(due, tz)}"
        )
        count, capped = slots_up_to(claim, now) if claim.catch_up == "latest" else (1, False)
        if count > 1:
            header += f"; {count}{'+' if capped else ''} missed runs coalesced into this one"
    return f"{header}\n{claim.prompt_text}"
