"""The overlap policy (issue 43 point 3), decided right before a send (``attempt.attempt``): what
happens to an occurrence due while the schedule's previous turn is still running.

- ``allow``: it is sent anyway (a target that takes one turn at a time may still refuse it: retried
  as before).
- ``skip``: it is recorded ``skipped`` in history with the reason, and the schedule moves on to its
  next slot.
- ``queue``: it waits for that turn to end: not sent, recorded ``queued`` once, and the claim is given
  back due again ``PROMPTYOSELF_OVERLAP_POLL`` seconds later, when the target is asked again. At most
  one waits: the schedule's later slots that come due meanwhile are recorded ``skipped`` when the
  waiting one is sent, and the schedule goes on after them. A waiting occurrence is sent at most
  ``PROMPTYOSELF_MISFIRE_GRACE`` late; past it, it is recorded ``skipped`` too.

"Still running" is the target's answer: its ``DeliveryTarget`` has ``running`` (``targets.base.
BusyCheck``), asked with the schedule's previous delivered turn (``store.receipts.last_turn``). A
target without it cannot tell: its schedules are sent whatever their policy (as ``allow``), and their
description says so (``registry.overlap_note``). A schedule stored with no policy (before 0014) has
its target's default (the plug-in's ``default_overlap``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from promptyoself import catchup, timing
from promptyoself.errors import PromptYoSelfError
from promptyoself.targets import registry
from promptyoself.targets.base import BusyCheck, DeliveryTarget, Occurrence, PreviousTurn, Receipt

SKIPPED = "skipped"
"""The history outcome of an occurrence not sent because the schedule's previous turn still ran."""
QUEUED = "queued"
"""The history outcome (recorded once) of an occurrence that waits for that turn to end."""
QUEUED_PREFIX = "queued: "
"""How a waiting occurrence's ``last_error`` begins: the next claim knows it waits (``waiting``)."""


@dataclass(frozen=True)
class Verdict:
    action: Literal["send", "skip", "wait"]
    text: str | None = None
    """The history row's error (skip, wait): why it was not sent."""


SEND = Verdict("send")


def waiting(last_error: str | None) -> bool:
    """Whether a claimed occurrence already waits for the previous turn (``queue``)."""
    return (last_error or "").startswith(QUEUED_PREFIX)


def decide(policy: str, busy: bool, *, already_waiting: bool, late: timedelta, grace: timedelta,
           what: str) -> Verdict:
    """The policy's verdict on an occurrence whose target answered ``busy`` (pure). ``late``: how long
    after its slot it is now; ``what``: the words for the turn that still runs."""
    if not busy or policy == "allow":
        return SEND
    if policy == "skip":
        return Verdict("skip", f"{SKIPPED}: {what} (overlap=skip); not sent. The schedule goes on at its next run.")
    if already_waiting and late > grace:
        return Verdict("skip", f"{SKIPPED}: waited {timing.format_duration(late)} for {what} (overlap=queue), "
                               f"past PROMPTYOSELF_MISFIRE_GRACE ({timing.format_duration(grace)}); not sent.")
    return Verdict("wait", f"{QUEUED_PREFIX}{what} (overlap=queue); sent once it has ended.")


async def verdict(core: Any, claim: Any, occ: Occurrence, target: DeliveryTarget, now: datetime) -> Verdict:
    """Ask the target whether the schedule's previous turn still runs, when its policy cares and the
    target can tell (raises like ``send`` when the target cannot be asked), and decide."""
    policy = registry.overlap_policy(claim.overlap, claim.target)
    if policy == "allow" or not isinstance(target, BusyCheck):
        return SEND
    last = await core.deliveries.last_turn(claim.id)
    previous = None if last is None else PreviousTurn(last.run_id, last.attempted_at, Receipt.from_json(last.receipt))
    busy = await target.running(occ, previous)
    run = f" (run {previous.run_id})" if previous is not None and previous.run_id else ""
    what = f"a turn is still running at the {target.name} target{run}"
    return decide(policy, busy, already_waiting=waiting(claim.last_error), late=now - claim.next_run,
                  grace=core.settings.misfire_grace, what=what)


def due_meanwhile(claim: Any, now: datetime) -> tuple[datetime, ...]:
    """For an occurrence that waited for the previous turn (``waiting``): the schedule's slots after
    it that came due by ``now`` (at most ``catchup.MAX_MISSED_ROWS``), recorded ``skipped`` with it
    (at most one waits); () for any other."""
    if not waiting(claim.last_error) or claim.schedule_type == "once":
        return ()
    tz = timing.resolve_zone(claim.timezone, "UTC")
    out: list[datetime] = []
    at = claim.next_run
    while len(out) < catchup.MAX_MISSED_ROWS:
        try:
            nxt = timing.next_run_after(claim.schedule_type, claim.schedule_value, tz, after=at, anchor=claim.anchor)
        except PromptYoSelfError:
            break
        if nxt is None or nxt > now:
            break
        out.append(nxt)
        at = nxt
    return tuple(out)
