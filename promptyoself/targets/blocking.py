"""For a target whose client blocks (the Letta REST and Letta Code clients): its calls run in a pool
of its own, sized for the engine's sends (``PROMPTYOSELF_MAX_IN_FLIGHT``) plus look-ups and probes, so
that a target never waits for threads that another part of the process (or another target) holds, as
it would in the event loop's small default pool (``min(32, cores + 4)``).

A call whose awaiting coroutine is cancelled goes on in its thread; its answer is lost. For a send
that means: in doubt (the engine records it so, and looks the occurrence up before sending again).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class BlockingCalls:
    def __init__(self, workers: int, name: str) -> None:
        self._workers = max(1, workers)
        self._name = name
        self._pool: ThreadPoolExecutor | None = None

    async def run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix=self._name)
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kw))

    def close(self) -> None:
        """Let the threads end once their calls return (a call under way is not waited for)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
