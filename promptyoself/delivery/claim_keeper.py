"""The claim keeper under the delivery loop: ``ClaimKeeper`` renews this executor's claims while it
holds them (``run``, one task of the executor's task group) and fences a send whose claim may have
run out (``may_send``)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from promptyoself.delivery.watch import wait_event
from promptyoself.store.db import Store
from promptyoself.store.delivery_store import SqlDeliveryStore

if TYPE_CHECKING:
    from promptyoself.store.delivery_store import DeliveryStore

log = logging.getLogger(__name__)


async def renew_claims(store: DeliveryStore, owner: str, ids: Collection[int], until: datetime) -> set[int]:
    """One renewal (``DeliveryStore.renew``): the ids ``owner`` still holds."""
    return await store.renew(owner, ids, until)


class ClaimKeeper:
    """Extends this executor's live claims every third of the lease, so a claim held by a running
    process never expires mid-send; only a dead (or frozen) holder's claim does.

    Fencing: every claim carries a deadline (monotonic seconds) counted from the start of its last
    successful claim or renewal, i.e. no later than when the database's ``claim_until`` runs out. A
    sender asks ``may_send`` before it starts a send, which is true only while more than ``margin``
    is left. A renewal that fails leaves the deadlines where they were (so they run out); a renewal
    that finds a claim no longer held drops it at once. Claims waiting in the queue are renewed
    like the others, so none of them outlives its lease unnoticed, however long it waits."""

    def __init__(
        self,
        store: DeliveryStore | Store,
        owner: str,
        lease: float,
        now: Callable[[], datetime],
        *,
        margin: float | None = None,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store: DeliveryStore = SqlDeliveryStore(store) if isinstance(store, Store) else store
        self.owner, self.lease, self.now = owner, lease, now
        self.margin = lease / 3 if margin is None else margin
        self.mono = mono
        self._ids: set[int] = set()
        self._deadline: dict[int, float] = {}
        self._lock = threading.Lock()  # the fence is asked from the blocking targets' threads too
        self._stop = asyncio.Event()

    def add(self, ids: Collection[int], claimed_at: float | None = None) -> None:
        """Keep ``ids`` renewed; ``claimed_at`` is the monotonic time taken BEFORE the claim query
        (the lease in the database cannot end earlier than ``claimed_at + lease``)."""
        until = (self.mono() if claimed_at is None else claimed_at) + self.lease
        with self._lock:
            self._ids.update(ids)
            for i in ids:
                self._deadline[i] = until

    def discard(self, schedule_id: int) -> None:
        with self._lock:
            self._ids.discard(schedule_id)
            self._deadline.pop(schedule_id, None)

    def held(self) -> list[int]:
        with self._lock:
            return list(self._ids)

    def may_send(self, schedule_id: int) -> bool:
        """True while the claim is known held with more than ``margin`` of its lease left."""
        with self._lock:
            deadline = self._deadline.get(schedule_id)
        return deadline is not None and self.mono() < deadline - self.margin

    async def renew_now(self) -> None:
        """One renewal round (the keeper task's; tests await it directly)."""
        with self._lock:
            ids = list(self._ids)
        if not ids:
            return
        started = self.mono()
        try:
            held = await renew_claims(self.store, self.owner, ids, self.now() + timedelta(seconds=self.lease))
        except Exception:
            log.exception("renewing delivery claims failed; they stop being sent %.3gs before their lease "
                          "runs out", self.margin)
            return
        lost = [i for i in ids if i not in held]
        with self._lock:
            for i in held:
                if i in self._ids:
                    self._deadline[i] = started + self.lease
            for i in lost:  # expired and taken over (or already recorded): never send on it
                self._ids.discard(i)
                self._deadline.pop(i, None)
        if lost:
            log.warning("claims lost on schedule(s) %s; not sending them", ", ".join(map(str, lost[:20])))

    async def run(self) -> None:
        """The keeper's task: a renewal every third of the lease, until
        ``stop`` was asked and no claim is held any more (claims of sends still running keep being
        renewed while the executor stops)."""
        period = max(0.05, self.lease / 3)
        while True:
            await wait_event(self._stop, period)
            with self._lock:
                empty = not self._ids
            if empty and self._stop.is_set():
                return
            await self.renew_now()
            if self._stop.is_set():  # stopping: look again soon, until the last running send ends
                await asyncio.sleep(min(period, 0.2))

    def stop(self) -> None:
        """(On the loop.) Stop once no claim is left."""
        self._stop.set()

    def let_go(self, ids: Collection[int]) -> None:
        """Stop renewing ``ids`` and fence them off at once (sends cancelled at shutdown: their claims
        run out after the lease, and whoever claims them next looks them up first)."""
        for i in ids:
            self.discard(i)
