"""What an attempt writes, decided without the database (pure): each ``Attempt`` becomes a frozen
``store.claims.Outcome`` (its history rows and the schedule's next state, computed by ``next_state``
from what the claim saw, its ``Basis``), and a written outcome becomes the attempt's ``Result``.
``delivery.recorder`` writes them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from promptyoself import timing
from promptyoself.delivery import alerts
from promptyoself.delivery.alerts import AlertRules
from promptyoself.delivery.attempt import SENT_ON_LOST_CLAIM, Attempt, Result
from promptyoself.store import LIVE_STATES
from promptyoself.store.claims import Outcome
from promptyoself.store.records import ScheduleRow

log = logging.getLogger("promptyoself.delivery.recorder")


@dataclass(frozen=True)
class Basis:
    """The schedule's columns that its next state depends on (``next_state``), as the claim saw them
    or as the store returned them after a change."""

    state: str
    schedule_type: str
    schedule_value: str
    timezone: str
    anchor: datetime | None
    next_run: datetime | None
    repetition_count: int
    max_repetitions: int | None
    catch_up: str
    failures_in_row: int = 0

    @classmethod
    def of_row(cls, row: ScheduleRow) -> Basis:
        """From a schedule's columns: a ``Claim`` (what the claim saw) or the store's fresh row."""
        return cls(row.state, row.schedule_type, row.schedule_value, row.timezone, row.anchor, row.next_run,
                   row.repetition_count, row.max_repetitions, row.catch_up, row.failures_in_row)

    def pairs(self) -> tuple[tuple[str, Any], ...]:
        return tuple(self.__dict__.items())


def next_state(
    basis: Basis,
    kind: str,
    now: datetime,
    attempted_at: datetime,
    attempt: int,
    error: str | None,
    delay: float | None,
    *,
    skip_to: datetime | None = None,
    pause_after: int = 0,
    after_now: bool = False,
) -> dict[str, Any]:
    """The columns of a schedule that change after an attempt of ``kind`` (pure). ``skip_to``: a
    missed attempt continues at that (due) slot (the catch-up rule). ``pause_after`` (the policy's
    ``pause_after_failures``, 0 = never): the ``failed`` occurrence that makes that many in a row
    pauses an active recurring schedule, ``last_error`` saying why; a delivery, or the pause, starts
    the count again. ``queued`` (overlap=queue, the previous turn still runs): the occurrence stays,
    due again ``delay`` seconds later, ``last_error`` saying why (and marking it waiting).
    ``after_now``: the schedule goes on at its first slot after ``now`` whatever its ``catch_up`` (the
    slots that came due while an occurrence waited are recorded skipped)."""
    state = basis.state
    active = state == "active"
    out: dict[str, Any] = {"claimed_by": None, "claim_until": None, "updated_at": now}
    if kind == "queued":
        out.update(last_error=error, due_at=now + timedelta(seconds=delay or 0) if active else None)
        return out
    if kind == "retry":
        out.update(attempt=attempt, last_error=error,
                   due_at=now + timedelta(seconds=delay or 0) if active else None)
        return out
    if kind == "paused":  # the agent is gone (or its id is rejected): stop until someone looks
        out.update(attempt=0, last_error=error, due_at=None, state="paused" if active else state)
        if basis.failures_in_row:
            out["failures_in_row"] = 0
        return out
    out["attempt"] = 0
    count = basis.repetition_count or 0
    if kind == "delivered":
        count += 1
        out.update(repetition_count=count, last_run=attempted_at, last_error=None)
        if basis.failures_in_row:
            out["failures_in_row"] = 0
    else:  # failed (attempts exhausted), missed (beyond the misfire grace), over_budget or skipped (not sent)
        out["last_error"] = error
    out.update(_after_slot(basis, kind, count, now, attempted_at, skip_to, after_now))
    if kind == "failed":
        out.update(_after_failure(basis, out.get("state", state), error, pause_after))
    return out


def _after_failure(basis: Basis, state: str, error: str | None, pause_after: int) -> dict[str, Any]:
    """One more failed occurrence in a row; the one that makes ``pause_after`` pauses a schedule that
    would go on (``state`` after the slot still active), and starts the count again."""
    failures = (basis.failures_in_row or 0) + 1
    if not (pause_after and failures >= pause_after and basis.state == "active" and state == "active"):
        return {"failures_in_row": failures}
    return {"state": "paused", "due_at": None, "failures_in_row": 0, "last_error": (
        f"paused: {failures} occurrences in a row failed (the operator's policy pause_after_failures="
        f"{pause_after}); resume it once the cause is fixed. The last error: {error or 'none recorded'}")}


def _after_slot(basis: Basis, kind: str, count: int, now: datetime, attempted_at: datetime,
                skip_to: datetime | None, after_now: bool = False) -> dict[str, Any]:
    """Where a schedule goes after a slot that is done with (delivered, failed, missed, over budget):
    a one-time prompt or a schedule at its last repetition ends; a recurring one continues."""
    live = basis.state in LIVE_STATES
    out: dict[str, Any] = {}
    if basis.schedule_type == "once" or (basis.max_repetitions is not None and count >= basis.max_repetitions):
        out.update(next_run=None, due_at=None)
        if live:
            out["state"] = "failed" if kind == "failed" and basis.schedule_type == "once" else "completed"
        return out
    # Recurring: everything up to now is coalesced into this occurrence; continue at the next slot
    # strictly after now (fixed rate for intervals: start + k*every). catch_up=all continues at the
    # slot after this one instead (each missed slot is sent); a missed one may skip to a due slot.
    slot = basis.next_run or attempted_at
    tz = timing.resolve_zone(basis.timezone, "UTC")
    after = slot if basis.catch_up == "all" and kind != "missed" and not after_now else max(now, slot)
    nxt = skip_to or timing.next_run_after(basis.schedule_type, basis.schedule_value, tz, after=after,
                                           anchor=basis.anchor)
    out.update(next_run=nxt, due_at=nxt if basis.state == "active" else None)
    if nxt is None and live:  # an RRULE's COUNT or UNTIL is reached
        out["state"] = "completed"
    return out


def missed_rows(a: Attempt, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The history rows of the slots an attempt records as missed besides its own (``also_missed``)."""
    note = a.error if a.kind == "missed" else (
        f"missed: coalesced into the run due {timing.to_utc_iso(a.claim.next_run)} (catch_up={a.claim.catch_up})")
    return [{**entry, "scheduled_for": slot, "outcome": "missed", "letta_run_id": None, "error": note, "attempt": 0,
             "receipt_state": None, "receipt": None, "tokens": None, "cost_usd": None,
             "lateness_s": round(max(0.0, (a.attempted_at - slot).total_seconds()), 3)} for slot in a.also_missed]


def skipped_rows(a: Attempt, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The history rows of the slots that came due while ``a``'s occurrence waited for the previous
    turn (overlap=queue: at most one waits), recorded ``skipped``."""
    note = (f"skipped: came due while the run due {timing.to_utc_iso(a.claim.next_run)} waited for the previous "
            "turn (overlap=queue: at most one waits); not sent")
    return [{**entry, "scheduled_for": slot, "outcome": "skipped", "letta_run_id": None, "error": note, "attempt": 0,
             "receipt_state": None, "receipt": None,
             "lateness_s": round(max(0.0, (a.attempted_at - slot).total_seconds()), 3)} for slot in a.also_skipped]


def outcome_of(a: Attempt, basis: Basis, now: datetime, rules: AlertRules | None = None) -> Outcome:
    """What to write for attempt ``a`` (its error already redacted), the next state computed on ``basis``;
    with ``rules``, the pause after failures in a row and the alerts it raises (``delivery.alerts``)."""
    claim = a.claim
    outcome = "failed" if a.kind == "paused" else a.kind
    entry = {
        "schedule_id": claim.id,
        "agent_id": claim.agent_id,
        "scheduled_for": claim.next_run,
        "attempted_at": a.attempted_at,
        "outcome": outcome,
        "attempt": a.attempt,
        "letta_run_id": a.run_id,
        "error": a.error,
        "lateness_s": _lateness(a),
        "receipt_state": None,
        "receipt": None,
        "tokens": None,
        "cost_usd": None,
    }
    if a.kind == "delivered" and a.receipt is not None:  # what the target reported of the turn (issue 43)
        bounded = a.receipt.bounded()
        tokens, cost = bounded.spend()  # what the cost budgets count (delivery.budget)
        entry.update(receipt_state=bounded.state, receipt=bounded.to_json(), tokens=tokens, cost_usd=cost)
    history = [] if a.kind == "queued" and a.already_queued else [entry]  # a wait is recorded once
    if a.also_missed and a.kind in ("delivered", "failed", "missed", "skipped"):
        history.extend(missed_rows(a, entry))
    if a.also_skipped:
        history.extend(skipped_rows(a, entry))
    # The claim ran out and someone else may hold the occurrence now: keep the truth in history, but
    # leave the schedule to the current holder. A send that reached Letta is kept apart
    # (SENT_ON_LOST_CLAIM) so that counting ``delivered`` stays true: the holder that took over the
    # expired claim asks Letta for the otid first and records the one ``delivered`` row.
    note = "claim lost before recording; schedule not advanced"
    lost = {**entry, "error": f"{a.error}; {note}" if a.error else note,
            "outcome": SENT_ON_LOST_CLAIM if a.kind == "delivered" else outcome}
    change = next_state(basis, a.kind, now, a.attempted_at, a.attempt, a.error, a.delay, skip_to=a.skip_to,
                        pause_after=rules.pause_after if rules is not None else 0, after_now=bool(a.also_skipped))
    raised = alerts.for_outcome(claim.id, claim.agent_id, claim.target, a.kind, claim.next_run, basis.state, change,
                                rules, now)
    lost_rows = () if a.kind == "queued" else (lost,)  # nothing was sent: nothing to keep apart
    return Outcome(claim.id, a.owner, claim.next_run, basis.pairs(), tuple(history), change, lost_rows, raised)


def _lateness(a: Attempt) -> float:
    return round(max(0.0, (a.attempted_at - a.claim.next_run).total_seconds()), 3)


def result_of(a: Attempt, outcome: Outcome | None) -> Result:
    """The attempt's result: with ``outcome`` written, the schedule's new state; without, lost."""
    claim = a.claim
    res = Result(claim.id, claim.agent_id, a.kind, attempt=a.attempt, error=a.error, run_id=a.run_id,
                 route=a.route, lateness_s=_lateness(a), auth_error=a.auth_error)
    if outcome is None:
        log.warning("schedule %s: claim lost before recording %s", claim.id, a.kind)
        res.outcome = SENT_ON_LOST_CLAIM if a.kind == "delivered" else "lost"
        return res
    basis = dict(outcome.basis)
    after = {**basis, **outcome.change}
    res.state = after["state"]
    res.next_run = after["next_run"]
    res.repetition_count = after["repetition_count"]
    res.max_repetitions = basis["max_repetitions"]
    res.retry_in = a.delay if a.kind in ("retry", "queued") else None
    return res
