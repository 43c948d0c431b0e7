"""The typed bundle handed to every layer below the faces: settings, store, Letta client, clock, and
the change signal, and the store's one async interface (``deliveries``: the engine's verbs and the
core's). ``Services`` is what the layers ask for; ``Deps`` provides it, and ``Core`` is a ``Deps``
holding its parts, so a core is a ``Services`` too. Delivery takes a ``Services`` and never imports
the core.

The store and the Letta client open on first use, so importing this module (and starting the MCP
handshake) costs neither SQLAlchemy nor httpx.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, Unpack

from typing_extensions import TypedDict

from promptyoself.config import Settings

if TYPE_CHECKING:
    from promptyoself.letta.client import LettaClient
    from promptyoself.store.db import Store
    from promptyoself.store.delivery_store import DeliveryStore
    from promptyoself.store.policy import Policy
    from promptyoself.store.records import DayAsk

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    """The one wall clock of the program (aware UTC). Tests pass their own ``Clock`` instead."""
    return datetime.now(UTC)


# ---- what the core may ask of the delivery side of its process ---------------------------------
# Defined here, below both the core and delivery (which may not import each other).


class DeliveryHealth(TypedDict):
    """What the delivery side of a process adds to ``health``."""

    executor: dict[str, Any] | None
    worker: dict[str, Any] | None
    letta_auth_error: str | None


class DeliveryView(Protocol):
    """What the core may ask of the delivery side of its process (implemented by
    ``promptyoself.delivery.service.DeliveryService``, which registers itself as ``Deps.delivery``)."""

    def health_info(self) -> DeliveryHealth: ...

    def delivers_here(self) -> bool:
        """True while a delivery loop runs (or is starting) in this process."""
        ...


class DeliveryStarter(Protocol):
    """Who delivers (``promptyoself.delivery.starter.Starter``, set as ``Deps.starter`` by the faces)."""

    def ensure(self) -> Any: ...


class Services(Protocol):
    """What the core's parts and delivery use of their process: ``Deps`` (and so ``Core``, a ``Deps``)."""

    settings: Settings
    clock: Clock
    delivery: DeliveryView | None
    starter: DeliveryStarter | None

    @property
    def store(self) -> Store: ...

    @property
    def deliveries(self) -> DeliveryStore: ...

    @property
    def letta(self) -> LettaClient: ...

    async def recent_policy(self, now: datetime) -> Policy: ...

    def now(self) -> datetime: ...

    def close(self) -> None: ...

    def on_change(self, listener: Callable[[], None]) -> None: ...

    def changed(self) -> None: ...


class Wiring(TypedDict, total=False):
    """What a caller may hand in instead of the defaults: an open store, a Letta client, a clock."""

    store: Store | None
    letta: LettaClient | None
    clock: Clock | None
    deliveries: DeliveryStore | None


class Deps:
    """Settings, store, Letta client and clock for one process, plus the listeners told of writes
    (a ``Services``)."""

    def __init__(self, settings: Settings, **wiring: Unpack[Wiring]) -> None:
        self.settings = settings
        self._store = wiring.get("store")
        self._letta = wiring.get("letta")
        self._deliveries = wiring.get("deliveries")
        self._lock = threading.Lock()
        self.clock: Clock = wiring.get("clock") or system_clock
        self._listeners: list[Callable[[], None]] = []
        # The delivery side of this process, if one registered (health and status report on it).
        self.delivery: DeliveryView | None = None
        # Who delivers, checked after every write (promptyoself.delivery.starter.starter_for).
        self.starter: DeliveryStarter | None = None

    @property
    def store(self) -> Store:
        """The database, opened (and migrated) on first use so that start-up stays fast."""
        if self._store is None:
            with self._lock:
                if self._store is None:
                    from promptyoself.store.db import Store

                    self._store = Store(self.settings.db_url)
        return self._store

    @property
    def deliveries(self) -> DeliveryStore:
        """The one async store interface (``store.delivery_store``): the verbs delivery and the core
        use, the database's unless a caller handed in another implementation
        (``store.memory.MemoryDeliveryStore`` in the fast tests of the engine and of the core)."""
        if self._deliveries is None:
            from promptyoself.store.delivery_store import SqlDeliveryStore

            store = self.store
            with self._lock:  # one store, one thread pool
                if self._deliveries is None:
                    # Its pool bounds the store calls at once as the engine's own pool did before the
                    # store was async: one per send in flight, plus the recorder, the keeper, the alarm
                    # and a side task.
                    self._deliveries = SqlDeliveryStore(store, day=self.budget_day,
                                                        threads=int(self.settings.max_in_flight) + 4)
        return self._deliveries

    async def budget_day(self, now: datetime) -> DayAsk:
        """What a claim counts its budget day against (``store.day_counts``): the day's start in
        ``PROMPTYOSELF_TIMEZONE`` and the operator's ``max_deliveries_per_agent_per_day``, with its cost
        budgets (``recent_policy``)."""
        from promptyoself.store.records import DayAsk

        p = await self.recent_policy(now)
        return DayAsk(self.settings.budget_day_start(now), p.max_deliveries_per_agent_per_day,
                      p.max_tokens_per_agent_per_day, p.max_cost_usd_per_agent_per_day)

    POLICY_MAX_AGE = 1.0
    """Seconds a policy read is reused by ``recent_policy`` (an operator's change shows within that)."""

    async def recent_policy(self, now: datetime) -> Policy:
        """The operator's policy, read at most once a second: what delivery's budgets and alert rules
        and the guardrails ``list`` and ``history`` show use (what a writer enforces is read fresh,
        ``Operator.policy``). The store's ``policy`` verb (the database's, the same for every process
        whatever its environment; a memory store's own): the store alone decides where it comes from."""
        return await self.deliveries.policy(self.settings, now, max_age=self.POLICY_MAX_AGE)

    @property
    def letta(self) -> LettaClient:
        if self._letta is None:
            with self._lock:
                if self._letta is None:
                    from promptyoself.letta.client import LettaClient

                    self._letta = LettaClient(
                        self.settings.letta_base_url,
                        self.settings.letta_token,
                        timeout=self.settings.letta_timeout,
                    )
        return self._letta

    def now(self) -> datetime:
        return self.clock()

    def close(self) -> None:
        if self._letta is not None:
            self._letta.close()
        if self._store is not None:
            self._store.close()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Register a callback run after any write that may change the earliest due time."""
        self._listeners.append(listener)

    def changed(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # a listener must never fail the write that triggered it
                log.exception("change listener failed")
