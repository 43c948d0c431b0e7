"""Recording attempts: each ``Attempt`` becomes a frozen ``store.claims.Outcome`` (its history rows and
the schedule's next state, computed here by the pure ``next_state`` from what the claim saw), and one
store verb (``record_outcomes``) writes a batch of them in one transaction that commits each only
while its claim is held. The store calls nothing back: when an operator changed a claimed schedule
meanwhile (paused, edited), the store writes nothing for it and returns its current columns, and the
next state is decided again on those (``record_batch``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from promptyoself import timing
from promptyoself.delivery.attempt import SENT_ON_LOST_CLAIM, Attempt, Claim, Result, attempt
from promptyoself.delivery.holdings import Holdings
from promptyoself.deps import Deps
from promptyoself.logs import Redactor
from promptyoself.store import LIVE_STATES
from promptyoself.store.claims import ClaimAsk, DatabaseBusy, Outcome, Recorded
from promptyoself.store.records import ScheduleRow

log = logging.getLogger(__name__)

BUSY_TRIES = 5
"""Transactions tried while the database stays busy (SQLite's lock beyond its timeout)."""
STALE_TRIES = 5
"""Times the next state is decided again for a schedule an operator keeps changing under its claim."""


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

    @classmethod
    def of_row(cls, row: ScheduleRow) -> Basis:
        """From a schedule's columns: a ``Claim`` (what the claim saw) or the store's fresh row."""
        return cls(row.state, row.schedule_type, row.schedule_value, row.timezone, row.anchor, row.next_run,
                   row.repetition_count, row.max_repetitions, row.catch_up)

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
) -> dict[str, Any]:
    """The columns of a schedule that change after an attempt of ``kind`` (pure). ``skip_to``: a
    missed attempt continues at that (due) slot (the catch-up rule)."""
    state = basis.state
    active = state == "active"
    out: dict[str, Any] = {"claimed_by": None, "claim_until": None, "updated_at": now}
    if kind == "retry":
        out.update(attempt=attempt, last_error=error,
                   due_at=now + timedelta(seconds=delay or 0) if active else None)
        return out
    if kind == "paused":  # the agent is gone (or its id is rejected): stop until someone looks
        out.update(attempt=0, last_error=error, due_at=None, state="paused" if active else state)
        return out
    out["attempt"] = 0
    count = basis.repetition_count or 0
    if kind == "delivered":
        count += 1
        out.update(repetition_count=count, last_run=attempted_at, last_error=None)
    else:  # failed (attempts exhausted), missed (beyond the misfire grace) or over_budget (not sent)
        out["last_error"] = error
    live = state in LIVE_STATES
    if basis.schedule_type == "once":
        out.update(next_run=None, due_at=None)
        if live:
            out["state"] = "failed" if kind == "failed" else "completed"
        return out
    if basis.max_repetitions is not None and count >= basis.max_repetitions:
        out.update(next_run=None, due_at=None)
        if live:
            out["state"] = "completed"
        return out
    # Recurring: everything up to now is coalesced into this occurrence; continue at the next slot
    # strictly after now (fixed rate for intervals: start + k*every). catch_up=all continues at the
    # slot after this one instead (each missed slot is sent); a missed one may skip to a due slot.
    slot = basis.next_run or attempted_at
    tz = timing.resolve_zone(basis.timezone, "UTC")
    after = slot if basis.catch_up == "all" and kind != "missed" else max(now, slot)
    nxt = skip_to or timing.next_run_after(basis.schedule_type, basis.schedule_value, tz, after=after,
                                           anchor=basis.anchor)
    out.update(next_run=nxt, due_at=nxt if active else None)
    if nxt is None and live:  # an RRULE's COUNT or UNTIL is reached
        out["state"] = "completed"
    return out


def missed_rows(a: Attempt, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The history rows of the slots an attempt records as missed besides its own (``also_missed``)."""
    note = a.error if a.kind == "missed" else (
        f"missed: coalesced into the run due {timing.to_utc_iso(a.claim.next_run)} (catch_up={a.claim.catch_up})")
    return [{**entry, "scheduled_for": slot, "outcome": "missed", "letta_run_id": None, "error": note, "attempt": 0,
             "lateness_s": round(max(0.0, (a.attempted_at - slot).total_seconds()), 3)} for slot in a.also_missed]


def outcome_of(a: Attempt, basis: Basis, now: datetime) -> Outcome:
    """What to write for attempt ``a`` (its error already redacted), the next state computed on ``basis``."""
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
    }
    history = [entry]
    if a.also_missed and a.kind in ("delivered", "failed", "missed"):
        history.extend(missed_rows(a, entry))
    # The claim ran out and someone else may hold the occurrence now: keep the truth in history, but
    # leave the schedule to the current holder. A send that reached Letta is kept apart
    # (SENT_ON_LOST_CLAIM) so that counting ``delivered`` stays true: the holder that took over the
    # expired claim asks Letta for the otid first and records the one ``delivered`` row.
    note = "claim lost before recording; schedule not advanced"
    lost = {**entry, "error": f"{a.error}; {note}" if a.error else note,
            "outcome": SENT_ON_LOST_CLAIM if a.kind == "delivered" else outcome}
    change = next_state(basis, a.kind, now, a.attempted_at, a.attempt, a.error, a.delay, skip_to=a.skip_to)
    return Outcome(claim.id, a.owner, claim.next_run, basis.pairs(), tuple(history), change, (lost,))


def _lateness(a: Attempt) -> float:
    return round(max(0.0, (a.attempted_at - a.claim.next_run).total_seconds()), 3)


def _result(a: Attempt, outcome: Outcome | None) -> Result:
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
    res.retry_in = a.delay if a.kind == "retry" else None
    return res


def record_batch(core: Deps, batch: list[Attempt], claim: ClaimAsk | None = None) -> Recorded | None:
    """Record ``batch``; every attempt gets its ``result`` or its ``failure``. One transaction, more
    only when the database stays busy (SQLite's lock beyond its timeout: tried again, the claims are
    still ours) or an operator changed a claimed schedule meanwhile (its next state is decided again
    on the columns the store returned). With ``claim``, the first transaction also claims the next
    occurrences: what it did is returned once committed, None if the batch was recorded without it."""
    now = core.now()
    redact = Redactor(core.settings)
    for a in batch:  # history is served by `history`: no secret in it, ever (as in the logs)
        if a.error:
            a.error = redact(a.error)
    todo = {a.claim.id: (a, outcome_of(a, Basis.of_row(a.claim), now)) for a in batch}
    claimed: Recorded | None = None
    busy = stale = 0
    while todo:
        try:
            done = core.deliveries.record([o for _, o in todo.values()], claim=claim)
        except DatabaseBusy as exc:
            busy += 1
            if busy == BUSY_TRIES:
                for a, _ in todo.values():
                    a.failure = exc
                break
            log.warning("recording %d attempt(s): database busy, retrying", len(todo))
            time.sleep(0.2 * busy)
            continue
        except Exception as exc:
            if claim is not None:  # maybe the claim's fault, not the attempts': record them alone
                log.exception("claiming while recording failed; recording the attempts alone")
                claim = None
                continue
            if len(todo) > 1:  # one bad attempt must not cost the others theirs: one at a time
                for a, _ in list(todo.values()):
                    record_batch(core, [a])
                break
            for a, _ in todo.values():
                a.failure = exc
            break
        if claim is not None:
            claimed, claim = done, None
        for sid in done.written:
            a, o = todo.pop(sid)
            a.result = _result(a, o)
        for sid in done.lost:
            a, _ = todo.pop(sid)
            a.result = _result(a, None)
        stale += 1
        for sid, row in done.fresh.items():
            a, _ = todo[sid]
            if stale == STALE_TRIES:
                a.failure = RuntimeError(f"schedule {sid} kept changing while its attempt was being recorded")
                del todo[sid]
                continue
            log.info("schedule %s changed while claimed; deciding its next state again", sid)
            todo[sid] = (a, outcome_of(a, Basis.of_row(row), core.now()))
    return claimed


def record_attempt(core: Deps, item: Attempt) -> Result:
    """Record one attempt (``deliver``'s path; the executor's recorder thread records its senders'
    attempts in batches through ``record_batch``, the same way)."""
    record_batch(core, [item])
    if item.failure is not None:
        raise item.failure
    assert item.result is not None
    return item.result


def deliver(
    core: Deps, claim: Claim, owner: str, *, stopping: Any = None, may_send: Callable[[], bool] | None = None
) -> Result:
    """Deliver one claimed occurrence and record the outcome. Never raises for Letta errors."""
    sent = attempt(core, claim, owner, stopping=stopping, may_send=may_send)
    return sent if isinstance(sent, Result) else record_attempt(core, sent)


class Recorder:
    """The senders' database thread. During a backlog it refills the executor's queue when it runs
    low (so no sender waits for a claim query before its send). And it records what the senders sent,
    in batches: everything that finished while the previous batch was being committed goes into one
    transaction (each attempt still conditional on its own claim), with the next claims when a
    backlog wants them. A sender does not wait for this; its agent stays claimed until it is done.

    ``record(batch, want)`` records (claiming up to ``want`` with it) and returns the claims and
    whether more was due; ``claim(want)`` claims alone; ``nudge()`` hands back to the loop's alarm."""

    def __init__(self, holdings: Holdings, *, record: Callable[[list[Attempt], int], tuple[list[Claim], bool]],
                 claim: Callable[[int], tuple[list[Claim], bool]], nudge: Callable[[], None]) -> None:
        self.holdings = holdings
        self._record = record
        self._claim = claim
        self._nudge = nudge
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="promptyoself-record", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                work = self.holdings.next_batch()
                if work is None:
                    return
                batch, want = work
                if not want:
                    self._record(batch, 0)
                    continue
                got: list[Claim] = []
                more = False
                try:  # with attempts to record: one transaction records them and claims
                    got, more = self._record(batch, want) if batch else self._claim(want)
                except Exception:
                    log.exception("claiming due prompts failed; the loop retries")
                finally:
                    if not self.holdings.took(got, want, more):
                        self._nudge()  # the backlog is done: back to the loop's alarm
            except Exception:  # never let the thread die: the claims it records would be stuck
                log.exception("delivery recorder error")
                time.sleep(0.1)
