"""The senders and the recorder, tasks of the executor's task group. ``run_sender`` (``max_in_flight``
of them per target, started when a claim for that target first comes back): take the next claim of
its target the executor holds (``Holdings.next_to_send``), send it (``attempt.attempt``, awaiting the
target, behind the claim's fence), hand the attempt to the recorder (``Holdings.sent``), take the
next; a claim released unsent is let go (``Parts.released``). ``run_recorder`` (one): records what
the senders sent, in batches (``delivery.recorder``)."""

from __future__ import annotations

import functools
import logging
import time

from promptyoself.delivery.attempt import Attempt, Claim, Result, attempt
from promptyoself.delivery.parts import Parts

log = logging.getLogger(__name__)


async def run_sender(parts: Parts, target: str | None = None) -> None:
    """One sender of ``target``'s lane (``Holdings``: each target has its own senders); ends once the
    holdings close the senders (after its send in flight, if any)."""
    holdings, keeper = parts.holdings, parts.keeper
    while (claim := await holdings.next_to_send(target)) is not None:
        sent: Attempt | Result | None = None
        began = time.monotonic()
        try:
            sent = await attempt(parts.core, claim, parts.owner, stopping=parts.state, targets=parts.targets,
                                 may_send=functools.partial(keeper.may_send, claim.id), io=parts.io)
        except Exception:
            log.exception("delivery of schedule %s failed", claim.id)
        holdings.sent(claim, sent if isinstance(sent, Attempt) else None, time.monotonic() - began)
        if not isinstance(sent, Attempt):  # released unsent (stopping, fenced off), or a bug
            parts.released(claim, sent)


async def run_recorder(parts: Parts) -> None:
    """The executor's recorder task. During a backlog it refills the holdings when they run low (so
    no sender waits for a claim query before its send). And it records what the senders sent, in
    batches: everything that finished while the previous batch was being committed goes into one
    transaction (each attempt still conditional on its own claim), with the next claims when a
    backlog wants them. A sender does not wait for this; its agent stays claimed until it is done.
    Ends once the holdings close the recorder and nothing is left to record."""
    holdings = parts.holdings
    while (work := await holdings.next_batch()) is not None:
        batch, want = work
        if not want:
            await parts.record(batch, 0)
            continue
        got: list[Claim] = []
        more = False
        try:  # with attempts to record: one transaction records them and claims
            got, more = await (parts.record(batch, want) if batch else parts.claim(want))
        except Exception:
            log.exception("claiming due prompts failed; the loop retries")
        finally:
            if not holdings.took(got, want, more):
                parts.wakeup.nudge()  # the backlog is done: back to the loop's alarm
