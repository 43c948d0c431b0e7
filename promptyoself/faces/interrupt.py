"""Ctrl-C in the long-running commands: exit code 130 (128 + SIGINT, as shells report it), no traceback.

Two kinds of blocks:

* ``SigintExits`` (``serve``: the HTTP service, ``--transport http|sse``): SIGINT is remembered and
  raised as ``KeyboardInterrupt``. uvicorn takes SIGINT over while it serves, shuts down gracefully,
  then raises it again: the handler sees it then, and ``seen`` tells the caller to exit 130 even
  when uvicorn swallowed the ``KeyboardInterrupt``.
* ``StdioSigintExits`` (the stdio server): its reader thread blocks on stdin and cannot be woken, so
  neither asyncio's cancellation nor ``KeyboardInterrupt`` can end the process (it hung, then printed
  three tracebacks). SIGINT runs ``cleanup`` (stop delivery within its grace, close the store) in a
  thread, flushes the logs and ends the process with ``os._exit(130)``. A second Ctrl-C ends it at once.

Both are ``promptyoself.signals.OnSignals``: they only act in the main thread (signal handlers can be
set nowhere else) and restore the previous handler on the way out.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

from promptyoself.signals import OnSignals

EXIT_INTERRUPTED = 130

log = logging.getLogger(__name__)


class SigintExits(OnSignals):
    """Within the block, SIGINT raises ``KeyboardInterrupt`` and sets ``seen``."""

    def __init__(self) -> None:
        super().__init__((signal.SIGINT,), self._on_sigint)
        self.seen = False

    def _on_sigint(self, signum: int) -> None:
        self.seen = True
        raise KeyboardInterrupt


class StdioSigintExits(SigintExits):
    """Within the block, SIGINT runs ``cleanup`` in a thread and then ends the process with exit code 130."""

    def __init__(self, cleanup: Callable[[], None], *, grace: float = 5.0) -> None:
        super().__init__()
        self.cleanup = cleanup
        self.grace = grace

    def _on_sigint(self, signum: int) -> None:
        if self.seen:  # a second Ctrl-C: do not wait for the clean-up
            _exit_now()
        self.seen = True
        threading.Thread(target=self._finish, name="promptyoself-sigint", daemon=True).start()

    def _finish(self) -> None:
        log.info("interrupted (Ctrl-C): stopping")  # here, not in the signal handler (logging locks)
        done = threading.Thread(target=self._cleanup, name="promptyoself-sigint-cleanup", daemon=True)
        done.start()
        done.join(self.grace)
        _exit_now()

    def _cleanup(self) -> None:
        try:
            self.cleanup()
        except Exception:
            log.debug("clean-up after Ctrl-C failed", exc_info=True)


def _exit_now() -> None:
    """Flush what was logged or written to stderr, then end the process with exit code 130."""
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:
            pass
    try:
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(EXIT_INTERRUPTED)


def stdin_is_terminal() -> bool:
    stdin = sys.stdin
    try:
        return stdin is not None and stdin.isatty()
    except (OSError, ValueError):
        return False
