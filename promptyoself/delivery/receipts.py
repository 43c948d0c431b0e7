"""Receipts that come after their delivery (issue 43 point 1).

A target that knows what the turn did when its send returns puts it in ``Sent.receipt``, and it is
recorded with the ``delivered`` row (``delivery.outcomes``; a target that gives none: ``none``,
saying so). One that learns it only later (Letta's asynchronous route: the run finishes after the
send answered) returns it ``pending``; the row is recorded delivered with that pending receipt, and
this module's task (``run_receipts``, a task of the executor's group beside the senders, never a
sender) asks the target's optional ``receipt`` (``targets.base.ReceiptSource``) for each pending row,
every ``EVERY`` seconds (put off during a backlog, for at most ``BACKLOG_WAIT``), until the target
answers a receipt that is not pending. A receipt still pending ``WAIT`` after its delivery is recorded
``timed_out``, saying so; the occurrence stays delivered either way. A drain (``promptyoself execute``)
makes one last pass before it returns (``last_pass``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

from promptyoself import timing
from promptyoself.delivery.bridge import Targets
from promptyoself.deps import Services
from promptyoself.logs import Redactor
from promptyoself.store.receipts import PendingRow
from promptyoself.targets.base import PendingReceipt, Receipt

log = logging.getLogger(__name__)

EVERY = 2.0
"""Seconds between two passes over the pending receipts."""
WAIT = timedelta(minutes=30)
"""How long after its delivery a receipt may stay pending; then it is recorded ``timed_out``."""
BATCH = 50
"""Pending rows asked in one pass (the next pass goes on after the last one asked, at once when this
one was full and recorded receipts: a burst's thousands are read one pass after another, not one pass
every ``EVERY``)."""
ASK_AT_ONCE = 2
"""Pending rows of one pass asked at the same time (a Letta run's receipt is three GETs one after the
other: asked one at a time, with a 2 s wait after each pass, four workers read the receipts of a
10,000-prompt burst in 210-243 s after its last message, now in 28-35 s: ``bench scaleout
--scaleout-receipts``). Two: the Letta target keeps two connections beyond its send slots, so a
receipt never waits for one a send needs, nor a send for one a receipt holds."""
ASK_TIMEOUT = 30.0
"""Seconds one target's ``receipt`` may take before the pass moves on (asked again next pass)."""
BACKLOG_WAIT = 30.0
"""How long a receipt pass may be put off while the engine has a backlog (``yields``). A burst of 10,000
due prompts over four workers is delivered in about 8 s: its receipts are read right after it. Before,
the pass went on beside the sends, and its reads (three GETs per Letta run) took the target's and the
machine's time from them: 0.12-0.15 ms of worker CPU per delivery in the scale-out bench."""
LAST_PASS = 10.0
"""Seconds the last pass of a drain may take at most."""
FOLLOWED_BY = "followed_by"
"""The key of a pending receipt's ``ref`` naming the delivering process that follows it up (the claim
owner that sent it: ``delivery.attempt.receipt_of``). The target never sees it (``ask``)."""
ORPHAN_AFTER = timedelta(minutes=2)
"""How long the other delivering processes leave a pending receipt to the one that follows it up; past
that (the process is gone, or stalls) any of them asks. Before this, every process asked every pending
receipt on every pass: with four workers, four times the reads at the target (three GETs each for a Letta
run) for nothing."""

def timed_out(pending: Receipt, waited: timedelta) -> Receipt:
    what = "the run" if pending.ref.get("run") or pending.ref.get("kind") == "run" else "the turn"
    return replace(pending, state="timed_out", ref={},
                   note=f"no receipt: {what} had not finished {timing.format_duration(waited)} after the delivery"
                        + (f" ({pending.note})" if pending.note else ""))


async def ask(core: Services, targets: Targets, row: PendingRow, owner: str | None = None) -> Receipt | None:
    """The receipt of ``row`` now: the target's answer, ``timed_out`` past ``WAIT``, or None (still
    pending, or the target could not be asked: the next pass asks again; or another delivering process
    than ``owner`` follows it up, for ``ORPHAN_AFTER``)."""
    pending = Receipt.from_json(row.receipt) or Receipt(state="pending")
    waited = core.now() - row.attempted_at
    follower = pending.ref.get(FOLLOWED_BY)
    if follower is not None:  # ours, not the target's
        if owner is not None and follower != owner and waited <= ORPHAN_AFTER:
            return None
        pending = replace(pending, ref={k: v for k, v in pending.ref.items() if k != FOLLOWED_BY})
    if waited > WAIT:
        return timed_out(pending, waited)
    try:
        target = targets.get(row.target)
    except Exception as exc:  # a plug-in that no longer loads: asked again until WAIT
        log.debug("the %s target of history row %s cannot be opened: %s", row.target, row.delivery_id, exc)
        return None
    source = getattr(target, "receipt", None)
    if source is None:
        return Receipt.none(f"the {target.name} target cannot read a receipt after the delivery")
    try:
        async with asyncio.timeout(ASK_TIMEOUT):
            got: Receipt = await source(PendingReceipt(row.delivery_id, row.agent_id, row.letta_run_id, pending,
                                                       row.attempted_at))
    except Exception as exc:  # asked again on the next pass, until WAIT
        log.debug("reading the receipt of history row %s from the %s target failed: %s", row.delivery_id,
                  target.name, exc)
        return None
    return None if got.state == "pending" else got


async def follow_up(core: Services, targets: Targets, after_id: int = 0,
                    owner: str | None = None) -> tuple[int, int]:
    """One pass: ask for up to ``BATCH`` pending receipts with ids above ``after_id`` (``ASK_AT_ONCE`` at
    a time) and record those that came (or timed out); ``owner``: this process's claim owner, which leaves
    to another process the receipts that one follows up (``ORPHAN_AFTER``). Returns the cursor for the
    next pass (0: start again from the oldest) and how many receipts it recorded."""
    rows: list[PendingRow] = await core.deliveries.pending_receipts(BATCH, after_id)
    if not rows:
        return 0, 0
    redact = Redactor(core.settings)
    at_once = asyncio.Semaphore(ASK_AT_ONCE)

    async def one(row: PendingRow) -> bool:
        async with at_once:
            got = await ask(core, targets, row, owner)
        if got is None:
            return False
        bounded = got.redacted(redact).bounded()
        tokens, cost = bounded.spend()  # counted by the cost budgets from now on (delivery.budget)
        await core.deliveries.complete_receipt(row.delivery_id, bounded.state, bounded.to_json(), tokens=tokens,
                                               cost_usd=cost)
        return True

    done = await asyncio.gather(*(one(row) for row in rows), return_exceptions=True)
    failed = [r for r in done if isinstance(r, BaseException)]
    if failed:  # each row is recorded or not on its own; the first failure says why (the pass logs it)
        raise failed[0]
    return (rows[-1].delivery_id if len(rows) == BATCH else 0), sum(1 for r in done if r is True)


async def run_receipts(core: Services, targets: Targets, owner: str,
                       backlog: Callable[[], bool] = lambda: False) -> None:
    """The engine's receipt task (``owner``: its claim owner): a pass every ``EVERY`` seconds until the
    run cancels it, put off while ``backlog()`` says more is due than the senders carry, for at most
    ``BACKLOG_WAIT`` (``yields``); the next pass at once after a full one that recorded receipts (more
    are pending, and they come: a burst's), never so after one that recorded none (the target is away,
    or the runs go on: the next look waits ``EVERY``). A pass that fails is logged; the next tries again."""
    cursor = 0
    last = time.monotonic()
    while True:
        if not yields(backlog(), time.monotonic() - last):
            recorded = 0
            try:
                cursor, recorded = await follow_up(core, targets, cursor, owner)
            except Exception as exc:  # the database is away, say: the next pass tries again
                log.warning("reading pending receipts failed (%s); the next pass tries again", exc)
                cursor = 0
            last = time.monotonic()
            if cursor and recorded:
                await asyncio.sleep(0)  # a cancel still lands here
                continue
        await asyncio.sleep(EVERY)


def yields(backlog: bool, since_last_pass: float) -> bool:
    """Whether the receipt pass waits now: during a backlog (prompts due and waiting for a send slot),
    the slots, the target and the database go to the deliveries, which are due now, and not to receipts,
    which can be read later; at most ``BACKLOG_WAIT`` seconds after the last pass, so that a backlog that
    lasts still gets its receipts (and its cost budgets their spend) read."""
    return backlog and since_last_pass < BACKLOG_WAIT


async def last_pass(core: Services, targets: Targets, owner: str | None = None) -> None:
    """A drain's last look at the pending receipts (at most ``LAST_PASS`` seconds): what finished by
    now is recorded; the rest stays pending for the next executor."""
    try:
        async with asyncio.timeout(LAST_PASS):
            await follow_up(core, targets, owner=owner)
    except Exception:  # TimeoutError included: the receipts stay pending
        log.debug("the last pass over pending receipts did not finish", exc_info=True)
