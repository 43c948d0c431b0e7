"""Start the server's delivery side after the MCP handshake, not before it.

``promptyoself.faces.delivery.server_lifespan`` checks the worker lease (``worker`` mode) or runs the loop
(``embedded``). Entering it needs SQLAlchemy, the store and the delivery modules: ~0.3 s of imports
and ~20 MB that the handshake itself does not need. Run as the server's lifespan directly, that work
happens before (or, in a thread, during) the client's ``initialize``/``tools/list``, and every
client start waits for it — Letta starts a new stdio process for every tool call.

``DeferredDelivery`` enters that same lifespan at the first of: the client's first ``tools/list``
(just after the reply), its first ``tools/call`` (before the call runs, so ``health`` and
``executor_status`` see the delivery side), or ``START_AFTER`` seconds after start (a client that
asks nothing still gets its worker). It leaves it when the server stops, exactly as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastmcp.server.middleware import Middleware, MiddlewareContext

from promptyoself.deps import Services

log = logging.getLogger(__name__)

START_AFTER = 2.0
"""Seconds after start at which delivery starts even if the client has sent no request."""
AFTER_LIST = 0.05
"""Delay after the first tools/list reply, so that the reply is written before the imports begin."""
CALL_WAIT = 30.0
"""How long a first tools/call waits for the delivery side to be up (it normally takes < 1 s)."""


class DeferredDelivery(Middleware):
    """Middleware + lifespan: ``build_server(core, lifespan=d.lifespan)`` then ``mcp.add_middleware(d)``."""

    def __init__(self, core: Services) -> None:
        self.core = core
        self._loop: asyncio.AbstractEventLoop | None = None
        self._go: asyncio.Event | None = None
        self._up: asyncio.Event | None = None  # set once delivery is up, or will not come
        self.started = False  # True while the executor's lifespan is entered

    def lifespan(self, server: Any) -> Any:
        return self._lifespan(server)

    @asynccontextmanager
    async def _lifespan(self, server: Any) -> AsyncIterator[dict[str, Any]]:
        self._loop = asyncio.get_running_loop()
        self._go, self._up = asyncio.Event(), asyncio.Event()
        stop = asyncio.Event()
        task = asyncio.create_task(self._run(server, stop), name="promptyoself-deferred-delivery")
        try:
            yield {}
        finally:
            stop.set()
            self._go.set()
            with contextlib.suppress(Exception):
                await task

    async def _run(self, server: Any, stop: asyncio.Event) -> None:
        assert self._go is not None and self._up is not None
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._go.wait(), START_AFTER)
            if stop.is_set():
                return
            executor = await asyncio.to_thread(importlib.import_module, "promptyoself.faces.delivery")
            if stop.is_set():  # the server ended while the delivery side was loading
                return
            async with executor.server_lifespan(self.core)(server):
                self.started = True
                self._up.set()
                await stop.wait()
            self.started = False
        except Exception:
            log.exception("the delivery side of this server could not start")
        finally:
            self._up.set()

    def _trigger(self, delay: float = 0.0) -> None:
        if self._go is None or self._go.is_set() or self._loop is None:
            return
        if delay > 0:
            self._loop.call_later(delay, self._go.set)
        else:
            self._go.set()

    async def on_list_tools(self, context: MiddlewareContext[Any], call_next: Callable[..., Any]) -> Any:
        result = await call_next(context)
        self._trigger(AFTER_LIST)
        return result

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Callable[..., Any]) -> Any:
        if self._up is not None and not self._up.is_set():
            self._trigger()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._up.wait(), CALL_WAIT)
        return await call_next(context)
