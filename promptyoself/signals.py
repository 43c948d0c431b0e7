"""Signal handlers for the length of a block: the one helper behind Ctrl-C and SIGTERM everywhere.

``OnSignals(signals, callback)``: within the block, each of ``signals`` calls ``callback(signum)``;
leaving the block (or ``restore()``, e.g. from the callback itself) puts the previous handlers back.
Handlers can be set only in the main thread: elsewhere the block installs nothing and ``installed``
is False. Its users:

* ``promptyoself.faces.interrupt``: Ctrl-C ends ``serve`` and the stdio server with exit code 130.
* ``promptyoself.delivery.worker.StopOnSignals``: SIGTERM and Ctrl-C stop ``worker`` and
  ``execute --loop`` gracefully.
* ``promptyoself.delivery.service.delivering``: SIGTERM stops the MCP server's delivery gracefully.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any, Self


class OnSignals:
    """Within the block, each of ``signals`` calls ``callback(signum)`` (main thread only)."""

    def __init__(self, signals: Iterable[int], callback: Callable[[int], None]) -> None:
        self.signals = tuple(signals)
        self.callback = callback
        self._previous: dict[int, Any] = {}

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.callback(signum)

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                try:
                    self._previous[sig] = signal.signal(sig, self._handler)
                except (ValueError, OSError):
                    continue
        return self

    def restore(self) -> None:
        """Put the previous handlers back (one not set from Python: the default); once only."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            try:
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            except (ValueError, OSError):  # not the main thread any more: nothing can be set
                pass

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.restore()
