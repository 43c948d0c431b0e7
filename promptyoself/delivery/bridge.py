"""The targets one executor talks to (issue 30 point 1). The engine names no target: a schedule's
``target`` column is looked up in ``promptyoself.targets.registry``, and the target is reached only
through ``DeliveryTarget`` (send behind the claim's fence, look-up, probe).

A target's coroutines are awaited by the executor's sender tasks on its event loop (a target may hold
clients bound to it: an ``httpx.AsyncClient``); the targets are built per run of
the executor and closed when it stops. Called without an executor (``attempt`` on its own: tests, a
one-off), the attempt opens its own and closes them after."""

from __future__ import annotations

import logging
import threading

from promptyoself.config import Settings
from promptyoself.logs import add_secret_source
from promptyoself.targets import registry
from promptyoself.targets.base import DeliveryTarget

log = logging.getLogger(__name__)
add_secret_source(registry.secrets)  # the history and the logs hide the targets' own secrets


def open_fence() -> bool:
    """The fence of an attempt made without one (tests, a one-off): always open."""
    return True


class Targets:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._held: dict[str, DeliveryTarget] = {}
        self._lock = threading.Lock()  # ``get`` is also called off the loop (the executor's warm-up)

    def get(self, name: str | None) -> DeliveryTarget:
        """The target ``name`` (the default one for None), built from the registry on first use."""
        key = name or registry.DEFAULT
        with self._lock:
            found = self._held.get(key)
            if found is None:
                found = self._held[key] = registry.create(key, self.settings)
        return found

    def held(self) -> list[DeliveryTarget]:
        with self._lock:
            return list(self._held.values())

    async def probe(self) -> None:
        """Does a target answer? Those this executor has used (the default one if none), in turn; the
        first that answers ends it. Raises the last one's error when none does."""
        targets = self.held() or [self.get(None)]
        error: BaseException | None = None
        for target in targets:
            try:
                await target.probe()
            except Exception as exc:
                error = exc
            else:
                return
        assert error is not None
        raise error

    async def aclose(self) -> None:
        """Close every target held; the next ``get`` builds a new one."""
        with self._lock:
            targets, self._held = list(self._held.values()), {}
        for target in targets:
            try:
                await target.aclose()
            except Exception:
                log.exception("closing the %s target failed", target.name)
