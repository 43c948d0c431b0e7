"""Recording attempts: each ``Attempt`` becomes a frozen ``store.claims.Outcome`` (``delivery.outcomes``,
pure), and one store verb (``record_outcomes``) writes a batch of them in one transaction that
commits each only while its claim is held. The store calls nothing back: when an operator changed a
claimed schedule meanwhile (paused, edited), the store writes nothing for it and returns its current
columns, and the next state is decided again on those (``record_batch``). The engine's recorder task
(``Recorder.run``, the last of the engine's three steps: claim, send, record) records its senders'
attempts through ``record_batch``: group commit, with the backlog's next claim in the same
transaction (``delivery.claim.Claims.ask``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from promptyoself.delivery.alerts import AlertRules, alert_rules, target_alerts
from promptyoself.delivery.attempt import Attempt, Claim, Result, attempt
from promptyoself.delivery.claim import Claims
from promptyoself.delivery.outcomes import Basis, outcome_of, result_of
from promptyoself.delivery.watch import LoopState, Outcomes, Wakeup
from promptyoself.deps import Services
from promptyoself.logs import Redactor
from promptyoself.store.claims import ClaimAsk, DatabaseBusy, Outcome, Recorded

log = logging.getLogger(__name__)

BUSY_TRIES = 5
"""Transactions tried while the database stays busy (SQLite's lock beyond its timeout)."""
STALE_TRIES = 5
"""Times the next state is decided again for a schedule an operator keeps changing under its claim."""

Todo = dict[int, tuple[Attempt, Outcome]]


async def record_batch(core: Services, batch: list[Attempt], claim: ClaimAsk | None = None) -> Recorded | None:
    """Record ``batch``; every attempt gets its ``result`` or its ``failure``. One transaction, more
    only when the database stays busy (SQLite's lock beyond its timeout: tried again, the claims are
    still ours) or an operator changed a claimed schedule meanwhile (its next state is decided again
    on the columns the store returned). With ``claim``, the first transaction also claims the next
    occurrences: what it did is returned once committed, None if the batch was recorded without it.
    The store's verbs are awaited (the alert rules' policy read, too: ``alerts.alert_rules``)."""
    now = core.now()
    redact = Redactor(core.settings)
    for a in batch:  # history is served by `history`: no secret in it, ever (as in the logs)
        if a.error:
            a.error = redact(a.error)
        if a.receipt is not None:  # what the agent or the receiver answered, too (issue 43)
            a.receipt = a.receipt.redacted(redact)
    rules: AlertRules | None = await alert_rules(core, now)
    todo: Todo = {a.claim.id: (a, outcome_of(a, Basis.of_row(a.claim), now, rules)) for a in batch}
    claimed: Recorded | None = None
    busy = stale = 0
    while todo:
        try:
            done = await core.deliveries.record([o for _, o in todo.values()], claim=claim)
        except DatabaseBusy as exc:
            busy += 1
            if busy == BUSY_TRIES:
                _fail(todo, exc)
                break
            log.warning("recording %d attempt(s): database busy, retrying", len(todo))
            await asyncio.sleep(0.2 * busy)
            continue
        except Exception as exc:
            if claim is not None:  # maybe the claim's fault, not the attempts': record them alone
                log.exception("claiming while recording failed; recording the attempts alone")
                claim = None
                continue
            await _one_at_a_time(core, todo, exc)
            break
        if claim is not None:
            claimed, claim = done, None
        stale += 1
        _apply(core, todo, done, stale, rules)
    await target_alerts(core, batch, now)
    return claimed


def _fail(todo: Todo, exc: BaseException) -> None:
    for a, _ in todo.values():
        a.failure = exc
    todo.clear()


async def _one_at_a_time(core: Services, todo: Todo, exc: BaseException) -> None:
    """A transaction failed: one bad attempt must not cost the others theirs (each alone)."""
    if len(todo) > 1:
        for a, _ in list(todo.values()):
            await record_batch(core, [a])
        todo.clear()
    else:
        _fail(todo, exc)


def _apply(core: Services, todo: Todo, done: Recorded, stale: int, rules: AlertRules | None = None) -> None:
    """What one transaction did: results for the written and the lost; the changed ones decided again."""
    for sid in done.written:
        a, o = todo.pop(sid)
        a.result = result_of(a, o)
    for sid in done.lost:
        a, _ = todo.pop(sid)
        a.result = result_of(a, None)
    for sid, row in done.fresh.items():
        a, _ = todo[sid]
        if stale == STALE_TRIES:
            a.failure = RuntimeError(f"schedule {sid} kept changing while its attempt was being recorded")
            del todo[sid]
            continue
        log.info("schedule %s changed while claimed; deciding its next state again", sid)
        todo[sid] = (a, outcome_of(a, Basis.of_row(row), core.now(), rules))


async def record_attempt(core: Services, item: Attempt) -> Result:
    """Record one attempt (``deliver``'s path; the executor's recorder task records its senders'
    attempts in batches through ``record_batch``, the same way)."""
    await record_batch(core, [item])
    if item.failure is not None:
        raise item.failure
    assert item.result is not None
    return item.result


def deliver(
    core: Services, claim: Claim, owner: str, *, stopping: Any = None, may_send: Callable[[], bool] | None = None
) -> Result:
    """Deliver one claimed occurrence and record the outcome, from synchronous code (tests, a
    one-off: the attempt and its record run in an event loop of their own). Never raises for Letta
    errors."""

    async def deliver_and_record() -> Result:
        sent = await attempt(core, claim, owner, stopping=stopping, may_send=may_send)
        return sent if isinstance(sent, Result) else await record_attempt(core, sent)

    return asyncio.run(deliver_and_record())


class Recorder:
    """The engine's recorder task (``run``, one per run) and what an attempt's end changes: the
    claim is no longer kept, its outcome is counted (``Outcomes``), the alarm is nudged when the
    agents just recorded may have more due."""

    def __init__(self, claims: Claims, outcomes: Outcomes, wakeup: Wakeup, state: LoopState) -> None:
        self.claims, self.outcomes, self.wakeup, self.state = claims, outcomes, wakeup, state

    async def run(self) -> None:
        """During a backlog it refills the holdings when they run low (so no sender waits for a claim
        query before its send). And it records what the senders sent, in batches: everything that
        finished while the previous batch was being committed goes into one transaction (each attempt
        still conditional on its own claim), with the next claims when a backlog wants them. A sender
        does not wait for this; its agent stays claimed until it is done. Ends once the holdings close
        the recorder and nothing is left to record."""
        holdings = self.claims.holdings
        while (work := await holdings.next_batch()) is not None:
            batch, want = work
            if not want:
                await self.record(batch, 0)
                continue
            got: list[Claim] = []
            more = False
            try:  # with attempts to record: one transaction records them and claims
                got, more = await (self.record(batch, want) if batch else self.claims.claim(want))
            except Exception:
                log.exception("claiming due prompts failed; the loop retries")
            finally:
                if not holdings.took(got, want, more):
                    self.wakeup.nudge()  # the backlog is done: back to the loop's alarm

    async def record(self, batch: list[Attempt], want: int = 0) -> tuple[list[Claim], bool]:
        """Record ``batch``; with ``want``, claim up to that many in the same transaction (the agents
        recorded are free by then) and return the claims and whether more was due (as ``Claims.claim``)."""
        claims = self.claims
        claimed_at = claims.keeper.mono()
        ask = claims.ask(want, [a.claim.id for a in batch]) if want else None
        recorded = None
        try:
            recorded = await record_batch(claims.core, batch, ask)
        except Exception as exc:
            for a in batch:
                a.failure = a.failure or exc
        for a in batch:
            claims.keeper.discard(a.claim.id)
            if a.result is not None:
                self.outcomes.count(a.result)
            else:  # the claim stays until its lease runs out; then the occurrence is retried
                log.error("recording the attempt on schedule %s failed: %s", a.claim.id, a.failure)
        claims.holdings.recorded(batch)
        if claims.holdings.drained() or self.state.is_set():
            self.wakeup.nudge()  # the agents just recorded may have more due
        if recorded is None:
            return [], False
        return claims.took(recorded.claimed, recorded.taken_over, claimed_at), recorded.more_due

    def released(self, claim: Claim, res: Result | None) -> None:
        """A sender's claim was released unsent (stopping, or fenced off), or a bug: the claim
        expires; the loop may claim again."""
        self.wakeup.nudge()
        self.claims.keeper.discard(claim.id)
        if res is not None:
            self.outcomes.count(res)
