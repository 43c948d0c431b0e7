"""The text an agent reads: one header line (schedule id, rule, timezone, lateness if late), then the
prompt (``envelope``). Pure."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol

from promptyoself import timing
from promptyoself.errors import PromptYoSelfError


class Claim(Protocol):
    """What the envelope reads of a claimed occurrence (``attempt.Claim`` has it)."""

    @property
    def id(self) -> int: ...
    @property
    def schedule_type(self) -> str: ...
    @property
    def schedule_value(self) -> str: ...
    @property
    def timezone(self) -> str: ...
    @property
    def anchor(self) -> datetime | None: ...
    @property
    def next_run(self) -> datetime: ...
    @property
    def catch_up(self) -> str: ...
    @property
    def prompt_text(self) -> str: ...

LATE_AFTER = timedelta(seconds=60)
"""A delivery at least this late says so in its envelope."""
MAX_COUNTED_SLOTS = 1000
"""Counting the cron slots a catch-up coalesces stops here ("1000+")."""


def rule_text(claim: Claim) -> str:
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


def slots_up_to(claim: Claim, now: datetime) -> tuple[int, bool]:
    """How many of the schedule's slots fall in ``[next_run, now]`` (>= 1), and whether the count
    was cut off at ``MAX_COUNTED_SLOTS``. A catch-up delivery coalesces all of them."""
    if claim.schedule_type == "once" or now <= claim.next_run:
        return 1, False
    try:
        if claim.schedule_type == "interval":
            every = timing.parse_interval(claim.schedule_value)
            return 1 + (now - claim.next_run) // every, False
        tz = timing.resolve_zone(claim.timezone, "UTC")
        count, at = 1, claim.next_run
        while count < MAX_COUNTED_SLOTS:
            nxt = timing.next_run_after(claim.schedule_type, claim.schedule_value, tz, after=at, anchor=claim.anchor)
            if nxt is None or nxt > now:
                return count, False
            at = nxt
            count += 1
        return count, True
    except PromptYoSelfError:
        return 1, False


def envelope(claim: Claim, now: datetime, message_format: str = "annotated") -> str:
    """The text sent to the agent: one header line (schedule id, rule, timezone, lateness if late),
    then the prompt. ``plain`` sends the prompt alone."""
    if message_format == "plain":
        return claim.prompt_text
    tz = timing.resolve_zone(claim.timezone, "UTC")
    header = f"[PromptYoSelf] Scheduled prompt #{claim.id} ({rule_text(claim)}, timezone {tz.key})"
    late = now - claim.next_run
    if late >= LATE_AFTER:
        header += (
            f" - late by {timing.format_duration(late)}: it was due "
            f"{timing.to_local_iso(claim.next_run, tz)}"
        )
        count, capped = slots_up_to(claim, now) if claim.catch_up == "latest" else (1, False)
        if count > 1:
            header += f"; {count}{'+' if capped else ''} missed runs coalesced into this one"
    return f"{header}\n{claim.prompt_text}"
