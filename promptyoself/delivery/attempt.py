"""Delivering one claimed occurrence: decide (missed? late?), send, and record the outcome.

A coroutine, in a sender task of the executor (``delivery.senders``), awaiting the target and the
store (``DeliveryStore``, async) directly. The protocol:

1. The executor claimed the occurrence ``(id, next_run)`` (``DeliveryStore.claim``).
2. ``attempt`` builds the message envelope and hands it to the schedule's target, or, for a one-time
   prompt later than ``PROMPTYOSELF_MISFIRE_GRACE``, sends nothing; it returns the ``Attempt``.
3. ``delivery.recorder`` writes, in ONE transaction that commits only while the claim is still held,
   the history row and the schedule's next state (advanced, retried later, failed, missed, paused or
   completed), and clears the claim. Several attempts may share that transaction: group commit.

Exactly once: a send starts only while its claim is fenced as held (``may_send``, asked before the
work and again by the target right before the request is written), every send carries the
occurrence's id (``otid_for``), and an occurrence whose last attempt may have arrived
(``Claim.in_doubt``: a timeout or reset after connecting, or a claim taken over from an expired
holder) is first looked up (``DeliveryTarget.lookup``) and recorded ``delivered`` without a send when
it is there, also past the misfire grace. A claim taken over is never given back unsent
(``give_back``). docs/deployment.md states what remains."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from promptyoself import catchup, timing
from promptyoself.delivery import budget, overlap
from promptyoself.delivery.bridge import Targets, open_fence
from promptyoself.delivery.envelope import envelope
from promptyoself.delivery.receipts import FOLLOWED_BY
from promptyoself.delivery.retry import AUTH_PREFIXES, FENCED, IN_DOUBT_PREFIX, RetryPolicy
from promptyoself.deps import Services
from promptyoself.errors import PromptYoSelfError, StillPending
from promptyoself.store.records import ScheduleRow, column_names
from promptyoself.targets.base import REF_ENTRIES, Occurrence, Receipt, Sent

log = logging.getLogger(__name__)

SENT_ON_LOST_CLAIM = "sent_lost_claim"
"""History outcome of a send that reached Letta after its claim had been lost (a stalled holder)."""


_rng = random.Random()
__all__ = ["IN_DOUBT_PREFIX", "SENT_ON_LOST_CLAIM", "Attempt", "Claim", "Result", "attempt",
           "envelope", "give_back", "occurrence_of", "otid_for", "policy"]


@dataclass(frozen=True, kw_only=True)
class Claim(ScheduleRow):
    """A claimed schedule, as the claim saw it (``store.records.ScheduleRow``: every column, so a new
    column needs nothing here), and what the claim knows besides."""

    next_run: datetime  # a claimed occurrence always has its slot
    in_doubt: bool = False
    """An earlier attempt on this occurrence may have reached Letta: check before sending."""
    taken_over: bool = False
    """Claimed from a holder whose claim ran out unrecorded. The expired claim is then the only mark
    that the occurrence is in doubt, so such a claim is never given back unsent: it is left to run
    out, and whoever claims it next sees the same mark (``give_back``)."""

    @classmethod
    def from_row(cls, row: Any, *, taken_over: bool = False) -> Claim:
        """From a claimed schedule row (``store.claim_due``) or a ``Schedule``. ``taken_over``: the
        claim was taken from a holder whose lease ran out (it may have sent)."""
        assert row.next_run is not None
        values = {name: getattr(row, name) for name in column_names(ScheduleRow)}
        attempt = values["attempt"] or 0
        last_error = values["last_error"] or ""
        return cls(**values, day=getattr(row, "day", None), taken_over=taken_over,
                   in_doubt=taken_over or (attempt > 0 and last_error.startswith(IN_DOUBT_PREFIX)))


@dataclass
class Result:
    """What happened to one claimed occurrence."""

    schedule_id: int
    agent_id: str
    outcome: str  # delivered | retry | failed | missed | over_budget | skipped | queued | paused | released | lost
    attempt: int = 0
    error: str | None = None
    run_id: str | None = None
    route: str | None = None
    state: str | None = None
    next_run: datetime | None = None
    repetition_count: int = 0
    max_repetitions: int | None = None
    auth_error: bool = False
    retry_in: float | None = None
    lateness_s: float | None = None

    @property
    def delivered(self) -> bool:
        return self.outcome == "delivered"

    def item(self) -> dict[str, Any]:
        """The ``executed`` entry of ``promptyoself_execute``."""
        out: dict[str, Any] = {
            "id": self.schedule_id,
            "agent_id": self.agent_id,
            "delivered": self.delivered,
            "next_run": timing.to_utc_iso(self.next_run) if self.next_run else None,
            "repetition_count": self.repetition_count,
            "max_repetitions": self.max_repetitions,
            "completed": self.state == "completed",
            "outcome": self.outcome,
            "attempt": self.attempt,
            "state": self.state,
            "letta_run_id": self.run_id,
        }
        if self.error:
            out["error"] = self.error
        return out


# ---- pure helpers ----------------------------------------------------------------------------


def otid_for(claim: Claim) -> str:
    """The occurrence's key in Letta (the message's ``otid``): the schedule and its slot, so every
    attempt on one occurrence carries the same key and the next occurrence another."""
    slot = int(claim.next_run.timestamp() * 1000)
    return f"promptyoself-{claim.id}-{slot}"


# ---- the delivery ----------------------------------------------------------------------------


def occurrence_of(claim: Claim, text: str, number: int) -> Occurrence:
    """The occurrence as its target sees it (``targets.base.Occurrence``): the otid as its id, the
    envelope as its text, a scheduling-API schedule's stored body as ``options["payload"]``."""
    options: dict[str, Any] = {}
    if claim.letta_payload:
        options["payload"] = json.loads(claim.letta_payload)
    options.update(json.loads(claim.target_options or "{}"))  # the target's own options (its plug-in's model)
    return Occurrence(schedule_id=claim.id, occurrence_id=otid_for(claim), agent_id=claim.agent_id, text=text,
                      prompt=claim.prompt_text, due=claim.next_run, attempt=number,
                      conversation_id=claim.conversation_id, options=options)


async def attempt(
    core: Services, claim: Claim, owner: str, *, stopping: Any = None, may_send: Callable[[], bool] | None = None,
    targets: Targets | None = None,
) -> Attempt | Result:
    """Decide and send: the ``Attempt`` to record, or the ``Result`` when there is nothing to record
    (stopping, or the fence ``may_send`` says the claim is lost or about to run out: it is released,
    nothing is sent). Never raises for a target's errors. ``targets``: the executor's; without, the
    attempt opens its own and closes them after."""
    if targets is not None:
        return await _attempt(core, claim, owner, stopping, may_send, targets)
    own = Targets(core.settings)
    try:
        return await _attempt(core, claim, owner, stopping, may_send, own)
    finally:
        await own.aclose()


async def _attempt(core: Services, claim: Claim, owner: str, stopping: Any, may_send: Callable[[], bool] | None,
                   targets: Targets) -> Attempt | Result:
    settings = core.settings
    now = core.now()
    number = claim.attempt + 1
    plan, missed = catch_up_plan(claim, now, settings.misfire_grace), None
    if plan.deliver != claim.next_run:  # the claimed slot is missed (catch_up): record, maybe skip ahead
        missed = missed_text(claim, plan, now, settings.misfire_grace)
        if not claim.in_doubt:  # in doubt, an earlier attempt may have arrived: ask the target first (below)
            return Attempt(claim, owner, "missed", now, number, error=missed, skip_to=plan.deliver,
                           also_missed=plan.missed[1:])
    if stopping is not None and stopping.is_set():
        await give_back(core, owner, [claim])
        return Result(claim.id, claim.agent_id, "released", attempt=claim.attempt)
    if may_send is not None and not may_send():
        await give_back(core, owner, [claim])  # a no-op when someone else holds it now
        return Result(claim.id, claim.agent_id, "released", attempt=claim.attempt, error=FENCED)
    occ = occurrence_of(claim, envelope(claim, now, settings.message_format), number)
    otid = occ.occurrence_id
    try:
        target = targets.get(claim.target)
        where = f"the {target.name} target"  # history's words for every target, not Letta's alone
        if claim.in_doubt:  # an earlier attempt may have reached the agent: ask before sending again
            found = await target.lookup(occ)
            if found.state == "found":  # history names the run that carried it (when the target says)
                return Attempt(claim, owner, "delivered", now, number, run_id=found.run_id,
                               error=f"already at {where} (occurrence {otid}) from an earlier attempt; not sent again",
                               receipt=Receipt.none("found by a look-up after an earlier attempt whose answer was "
                                                    "lost: no receipt"))
            if found.state == "pending":  # the agent has runs not started yet: one may carry it; look later
                msg = f"occurrence {otid} not at {where} yet but the agent has runs pending; not sent"
                raise StillPending(msg)
            if missed is not None:  # it never arrived, and it is too late to send it now
                return Attempt(claim, owner, "missed", now, number,
                               error=f"{missed} (occurrence {otid} not at {where}: no earlier attempt arrived)",
                               skip_to=plan.deliver, also_missed=plan.missed[1:])
        verdict = await _held(core, claim, owner, occ, target, now, number, plan)
        if isinstance(verdict, Attempt):  # the previous turn still runs, or over the daily budgets: not sent
            return verdict
        occ = replace(occ, text=budget.announce(occ.text, verdict))
        # The claim's fence is asked again by the target right before the request is written (after
        # the look-up above, and as late as it can): a holder that stalled since gives the claim back.
        sent = await target.send(occ, may_send or open_fence)
    except Exception as exc:  # what it means, and what next, is the retry policy's decision
        if not isinstance(exc, PromptYoSelfError):
            log.exception("delivery of schedule %s failed unexpectedly", claim.id)
        return await _after_failure(core, claim, owner, now, number, exc)
    return Attempt(claim, owner, "delivered", now, number, run_id=sent.run_id, route=sent.route,
                   also_missed=plan.missed, also_skipped=overlap.due_meanwhile(claim, now),
                   receipt=receipt_of(sent, target.name, owner))


async def _held(core: Services, claim: Claim, owner: str, occ: Occurrence, target: Any, now: datetime,
                number: int, plan: catchup.CatchUp) -> Attempt | budget.Verdict:
    """Why the occurrence is not sent now, or the budgets' verdict to send it with: the schedule's
    previous turn still runs (``delivery.overlap``: skipped, or queued and due again after
    ``PROMPTYOSELF_OVERLAP_POLL``), or the daily budgets are spent (``over_budget``)."""
    turn = await overlap.verdict(core, claim, occ, target, now)
    if turn.action == "wait":
        return Attempt(claim, owner, overlap.QUEUED, now, number, error=turn.text, delay=core.settings.overlap_poll,
                       already_queued=overlap.waiting(claim.last_error))
    if turn.action == "skip":
        return Attempt(claim, owner, overlap.SKIPPED, now, number, error=turn.text, also_missed=plan.missed,
                       also_skipped=overlap.due_meanwhile(claim, now))
    verdict = await budget.verdict(core, claim, now)
    if verdict.over is not None:
        return Attempt(claim, owner, budget.OVER_BUDGET, now, number, error=verdict.over)
    return verdict


def receipt_of(sent: Sent, target: str, owner: str) -> Receipt:
    """A send's receipt (issue 43): what the target reported, or ``none`` saying it gives none. A pending
    one is stored with the process that follows it up (``delivery.receipts.FOLLOWED_BY``: the sender's
    claim owner), so that the other delivering processes leave it to that one."""
    if sent.receipt is None:
        return Receipt.none(f"the {target} target gives no receipt")
    if sent.receipt.state == "pending":  # the target's first entries, and ours the one more (bounded later)
        own = {k: v for k, v in list(sent.receipt.ref.items())[:REF_ENTRIES] if k != FOLLOWED_BY}
        return replace(sent.receipt, ref={**own, FOLLOWED_BY: owner})
    return sent.receipt


def catch_up_plan(claim: Claim, now: datetime, grace: timedelta) -> catchup.CatchUp:
    """The schedule's missed-run rule (``catchup.catch_up``) for the claimed slot; on time, it is
    sent (a cron or RRULE slot less than ``ON_TIME`` late has no later slot due: they are minutes
    apart at least)."""
    if overlap.waiting(claim.last_error):  # it waited for the previous turn (overlap=queue): late on purpose
        return catchup.CatchUp(claim.next_run, (), 0)
    if now - claim.next_run < catchup.ON_TIME and claim.schedule_type != "interval":
        return catchup.CatchUp(claim.next_run, (), 0)
    tz = timing.resolve_zone(claim.timezone, "UTC")

    def following(slot: datetime) -> datetime | None:
        try:
            return timing.next_run_after(claim.schedule_type, claim.schedule_value, tz, after=slot,
                                         anchor=claim.anchor)
        except PromptYoSelfError:
            return None

    return catchup.catch_up(claim.catch_up, claim.next_run, now, grace, following)


def missed_text(claim: Claim, plan: catchup.CatchUp, now: datetime, grace: timedelta) -> str:
    """The error of the history row of a missed slot: how late, which policy, and what happens next."""
    late = timing.format_duration(now - claim.next_run)
    why = f"catch_up={claim.catch_up}" + ("" if claim.catch_up == "skip" else f", PROMPTYOSELF_MISFIRE_GRACE {grace}")
    count = f"{plan.total_missed}{'+' if plan.more else ''} runs missed" if plan.total_missed > 1 else "not delivered"
    then = "" if plan.deliver is None else f"; delivering the run due {timing.to_utc_iso(plan.deliver)} instead"
    return f"missed: {late} late ({why}); {count}{then}"


async def give_back(core: Services, owner: str, claims: list[Claim]) -> None:
    """Release claims on which nothing was sent, but not those taken over from an expired holder:
    they are left to run out so that the next claimer, too, knows the occurrence is in doubt."""
    ids = [c.id for c in claims if not c.taken_over]
    if ids:
        await core.deliveries.release(owner, ids)


def policy(core: Services) -> RetryPolicy:
    """The retry policy of ``core``'s settings."""
    return RetryPolicy.of(core.settings, _rng)


async def _after_failure(core: Services, claim: Claim, owner: str, now: datetime, number: int,
                         exc: BaseException) -> Attempt | Result:
    """A send failed: record what ``RetryPolicy.decide`` makes of it (or give the claim back)."""
    retry = policy(core)
    late = (now - claim.next_run).total_seconds()
    counted = await _transient_attempts(core, claim, number)
    decision = retry.decide(exc, number, late=late, in_doubt=claim.in_doubt, counted_attempts=counted)
    if decision.kind == "released":
        await give_back(core, owner, [claim])
        return Result(claim.id, claim.agent_id, "released", attempt=claim.attempt, error=decision.text)
    return Attempt(claim, owner, decision.kind, now, number, error=decision.text, delay=decision.delay,
                   auth_error=decision.auth)


async def _transient_attempts(core: Services, claim: Claim, attempt: int) -> int:
    """Attempts on this occurrence that count toward ``max_attempts``: auth errors do not (they
    wait for the credentials to be fixed, however long that takes)."""
    if core.settings.max_attempts is None or attempt < core.settings.max_attempts:
        return attempt
    prefixes = [prefix for auth in AUTH_PREFIXES for prefix in (auth, IN_DOUBT_PREFIX + auth)]
    return attempt - sum([await core.deliveries.count_attempts_with_error(claim.id, claim.next_run, prefix)
                          for prefix in prefixes])


# ---- recording -------------------------------------------------------------------------------


@dataclass
class Attempt:
    """One attempt on a claimed occurrence, made and waiting to be recorded (``delivery.recorder``)."""

    claim: Claim
    owner: str
    kind: str  # delivered | retry | failed | missed | over_budget | skipped | queued | paused
    attempted_at: datetime
    attempt: int
    error: str | None = None
    run_id: str | None = None
    route: str | None = None
    delay: float | None = None
    auth_error: bool = False
    result: Result | None = None
    failure: BaseException | None = None
    skip_to: datetime | None = None
    """A missed attempt's slot to continue from (a later due slot the catch-up rule sends)."""
    also_missed: tuple[datetime, ...] = ()
    """Later slots recorded as ``missed`` with this attempt (coalesced into it, or skipped)."""
    receipt: Receipt | None = None
    """A delivered attempt's receipt (issue 43): what the target reported of the turn, or why nothing."""
    also_skipped: tuple[datetime, ...] = ()
    """Later slots that came due while this occurrence waited for the previous turn (overlap=queue):
    recorded ``skipped`` with it, and the schedule goes on after them."""
    already_queued: bool = False
    """A ``queued`` attempt on an occurrence that already waited: its history row was written then."""
