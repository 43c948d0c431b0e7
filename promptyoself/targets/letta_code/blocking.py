"""For a target whose client blocks (today the Letta Code client, over the ``websockets`` sync API): its
calls run in a pool of its own, sized for the engine's sends (``PROMPTYOSELF_MAX_IN_FLIGHT``) plus
look-ups and probes, so that a target never waits for threads that another part of the process (or
another target) holds, as it would in the event loop's small default pool (``min(32, cores + 4)``).
The threads are daemons (``DaemonPool``): a send stuck until its turn's timeout never keeps a stopping
process alive, as ``ThreadPoolExecutor``'s joined-at-exit threads would. (The Letta REST target needs
none: its client is aiohttp's, on the engine's loop.)

A call whose awaiting coroutine is cancelled goes on in its thread; its answer is lost. For a send
that means: in doubt (the engine records it so, and looks the occurrence up before sending again).
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")


class DaemonPool(Executor):
    """A fixed pool of daemon threads. Unlike ``ThreadPoolExecutor`` it never delays interpreter exit
    (a send stuck in a timeout must not keep a stopping server alive)."""

    def __init__(self, size: int, name: str) -> None:
        self._size = max(1, size)
        self._name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            if self._closed:
                raise RuntimeError("pool is shut down")
            if not self._threads:
                for i in range(self._size):
                    t = threading.Thread(target=self._work, name=f"{self._name}-{i}", daemon=True)
                    t.start()
                    self._threads.append(t)
        fut: Future[Any] = Future()
        self._queue.put((fut, fn, args, kwargs))
        return fut

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, fn, args, kwargs = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                fut.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        if wait:
            for t in threads:
                t.join()


class BlockingCalls:
    def __init__(self, workers: int, name: str) -> None:
        self._workers = max(1, workers)
        self._name = name
        self._pool: DaemonPool | None = None

    async def run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        if self._pool is None:
            self._pool = DaemonPool(self._workers, self._name)
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kw))

    def close(self) -> None:
        """Let the threads end once their calls return (a call under way is not waited for)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
