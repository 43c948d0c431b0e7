"""Delivery inside the long-lived service (``promptyoself serve``): the loop in-process, holding the
worker lease.

The service is what ``worker`` mode's detached worker is, but supervised (systemd, launchd, Docker)
and serving HTTP beside it. It holds the same lease, so stdio servers and CLI writes on this machine
see a live worker and start none. On start it takes the lease over: a detached worker on this host
that holds it is sent SIGTERM (it finishes its in-flight sends and releases the lease). A live holder
on another host keeps it; the service then delivers anyway (claims keep every delivery single, as
with ``worker --shared``) and takes the lease when it frees. It never exits for idleness; when its
delivery engine stops by itself (a part of it died, ``LoopState.failed``), the service is told
(``on_failure``) and exits 1 saying why, as a worker does, so that its supervisor restarts it rather
than leaving an HTTP face up with nothing delivering.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from promptyoself import __version__
from promptyoself.delivery import worker
from promptyoself.delivery.engine import SHUTDOWN_GRACE, Engine, make_owner
from promptyoself.delivery.service import service_for
from promptyoself.deps import Services

log = logging.getLogger(__name__)

ROLE = "service"


def token_print(settings: Any) -> dict[str, str | None]:
    """What ``promptyoself token show`` may know of the service's operator token: where it came from
    and the first 12 hex digits of its SHA-256 (never the token)."""
    import hashlib

    from promptyoself.config import read_token_file, token_file

    secret = settings.http_token.get_secret_value().strip() if settings.http_token is not None else ""
    if not secret:
        return {"source": "none", "sha256": None}
    source = "file" if read_token_file(token_file(settings.db_url)) == secret else "environment"
    return {"source": source, "sha256": hashlib.sha256(secret.encode()).hexdigest()[:12]}


class Resident:
    """``async with Resident(core).run():`` delivers until the block ends: the engine's run
    (``Engine.run``) as a task, with the lease's heartbeat (``_guard``) as a side task of it.
    ``on_failure(why)`` is called (on the event loop) if the engine stops before the block ends."""

    def __init__(self, core: Services, on_failure: Callable[[str], None] | None = None) -> None:
        self.core = core
        self.owner = make_owner(ROLE)
        self.holds_lease = False
        self.executor: Engine | None = None
        self.on_failure = on_failure
        self._leaving = False
        self.token = token_print(core.settings)  # read once: the service reads its token when it starts

    def _info(self) -> str:
        ex = self.executor
        data: dict[str, Any] = {"role": ROLE, "version": __version__, "token": self.token}
        if ex is not None:
            info = ex.info()
            for k in ("last_tick", "next_due", "in_flight", "delivered", "failed", "retried", "missed",
                      "auth_error", "interval"):
                data[k] = info[k]
        return json.dumps(data)

    def take_lease(self, *, take_over: bool) -> bool:
        """Hold the worker lease; with ``take_over``, stop a detached worker of this host first."""
        store, secs = self.core.store, float(self.core.settings.lease_seconds)
        ok, holder = worker.acquire(self.core, self.owner, os.getpid(), secs, info=self._info())
        if not ok and take_over and holder is not None and holder.host == worker.hostname():
            log.info("taking the delivery over from worker pid %d", holder.pid)
            worker.stop_worker(self.core)
            ok, holder = worker.acquire(self.core, self.owner, os.getpid(), secs, info=self._info())
        if ok and not self.holds_lease:
            log.info("the service holds the worker lease for %s", store.describe())
        elif not ok and holder is not None and take_over:
            log.warning("worker pid %d on %s holds the lease; delivering beside it (claims keep each "
                        "delivery single)", holder.pid, holder.host)
        self.holds_lease = ok
        return ok

    async def _guard(self) -> None:
        settings = self.core.settings
        tick = max(min(float(settings.lease_seconds) / 3, 5.0), 0.05)
        while True:
            await asyncio.sleep(tick)
            try:
                if self.holds_lease:
                    alive = await asyncio.to_thread(
                        worker.heartbeat, self.core, self.owner, float(settings.lease_seconds), self._info()
                    )
                    if not alive:
                        log.warning("the service lost the worker lease; it keeps delivering and retries")
                        self.holds_lease = False
                else:
                    await asyncio.to_thread(self.take_lease, take_over=False)
            except Exception as exc:
                log.warning("the service cannot renew its lease: %s", str(exc).splitlines()[0][:200])

    def _ended(self, task: asyncio.Task[Any]) -> None:
        """The engine's task ended: unless the service is stopping, it stopped by itself."""
        if self._leaving:
            return
        ex = self.executor
        failure = None if task.cancelled() else task.exception()
        why = (ex.state.why if ex is not None and ex.state.why else None) or (
            f"{type(failure).__name__}: {failure}" if failure is not None else "it ended by itself")
        log.error("the service's delivery engine stopped: %s; the service exits", why)
        if self.on_failure is not None:
            self.on_failure(why)

    @asynccontextmanager
    async def run(self) -> AsyncIterator[Resident]:
        svc = service_for(self.core)
        try:
            await asyncio.to_thread(self.take_lease, take_over=True)
        except Exception as exc:  # the database may be down: deliver once it is back (health says down)
            log.error("the service cannot take the worker lease: %s", str(exc).splitlines()[0][:200])
        ex = Engine(self.core, role=ROLE, owner=self.owner, side_tasks={"service lease": self._guard})
        self.executor = ex
        svc.executor = ex
        task = asyncio.create_task(ex.run(), name="promptyoself-service-executor")
        task.add_done_callback(self._ended)
        try:
            yield self
        finally:
            self._leaving = True
            ex.request_stop()
            done, _ = await asyncio.wait([task], timeout=SHUTDOWN_GRACE + 0.5)
            if not done:
                task.cancel()
            if self.holds_lease:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(worker.release, self.core.store, self.owner)
            ex.close()
