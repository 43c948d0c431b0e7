"""Sending, the second of the engine's three steps (claim, send, record). ``run_sender``
(``max_in_flight`` tasks per target, started when a claim for that target first comes back): take
the next claim of its target the run holds (``Holdings.next_to_send``), send it (``attempt.attempt``,
awaiting the target, behind the claim's fence), hand the attempt to the recorder (``Holdings.sent``),
take the next; a claim released unsent is let go (``Recorder.released``)."""

from __future__ import annotations

import functools
import logging
import time

from promptyoself.delivery.attempt import Attempt, Result, attempt
from promptyoself.delivery.bridge import Targets
from promptyoself.delivery.claim import Claims
from promptyoself.delivery.recorder import Recorder
from promptyoself.delivery.watch import LoopState

log = logging.getLogger(__name__)


async def run_sender(claims: Claims, targets: Targets, recorder: Recorder, stopping: LoopState,
                     target: str | None = None) -> None:
    """One sender of ``target``'s lane (``Holdings``: each target has its own senders) over the run's
    ``claims``; ends once the holdings close the senders (after its send in flight, if any)."""
    holdings, keeper = claims.holdings, claims.keeper
    while (claim := await holdings.next_to_send(target)) is not None:
        sent: Attempt | Result | None = None
        began = time.monotonic()
        try:
            sent = await attempt(claims.core, claim, claims.owner, stopping=stopping, targets=targets,
                                 may_send=functools.partial(keeper.may_send, claim.id))
        except Exception:
            log.exception("delivery of schedule %s failed", claim.id)
        holdings.sent(claim, sent if isinstance(sent, Attempt) else None, time.monotonic() - began)
        if not isinstance(sent, Attempt):  # released unsent (stopping, fenced off), or a bug
            recorder.released(claim, sent)
