"""Signal handlers for the length of a block: the one helper behind Ctrl-C and SIGTERM everywhere.

``OnSignals(signals, callback)``: within the block, each of ``signals`` calls ``callback(signum)``;
leaving the block (or ``restore()``, e.g. from the callback itself) puts the previous handlers back.
Handlers can be set only in the main thread: elsewhere the block installs nothing and ``installed``
is False. Its users:

* ``promptyoself.faces.interrupt``: Ctrl-C ends ``serve`` and the stdio server with exit code 130.
* ``StopOnSignals`` (here): SIGTERM and Ctrl-C stop ``worker`` and ``execute --loop`` gracefully
  (``promptyoself.delivery.engine.run_in_foreground``).
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


class StopOnSignals(OnSignals):
    """Within the block, SIGTERM and SIGINT call ``callback`` (main thread only; else a no-op). When
    the block was stopped by SIGINT (Ctrl-C), leaving it raises ``KeyboardInterrupt``, after the
    graceful stop, so that the command exits 130 as an interrupted command does."""

    def __init__(self, callback: Callable[[], None]) -> None:
        super().__init__((signal.SIGTERM, signal.SIGINT), self._on_signal)
        self.stop = callback
        self.interrupted = False

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGINT:
            self.interrupted = True
        self.stop()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        super().__exit__(kind, exc, tb)
        if self.interrupted and kind is None:
            raise KeyboardInterrupt
