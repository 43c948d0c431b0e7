"""``promptyoself.signals.OnSignals``, the one helper behind Ctrl-C and SIGTERM (issue 20 point 7):
handlers for the block, in the main thread only, the previous ones back afterwards."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from promptyoself.signals import OnSignals


class Before:
    """A SIGUSR1 handler set before the block, recording ``-signum`` into ``seen``."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, signum: int, frame: object) -> None:
        self.seen.append(-signum)


@pytest.fixture
def before() -> Iterator[Before]:
    """``Before`` installed for SIGUSR1; the handler the test process had is put back afterwards."""
    handler = Before()
    old = signal.signal(signal.SIGUSR1, handler)
    try:
        yield handler
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_the_callback_runs_and_the_previous_handlers_come_back(before: Before) -> None:
    seen = before.seen
    with OnSignals((signal.SIGUSR1, signal.SIGUSR2), seen.append) as handlers:
        assert handlers.installed
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR2)
    assert seen == [signal.SIGUSR1, signal.SIGUSR2]
    assert signal.getsignal(signal.SIGUSR1) is before
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_restore_from_the_callback_puts_the_previous_handler_back_at_once(before: Before) -> None:
    seen = before.seen

    def once(signum: int) -> None:
        seen.append(signum)
        handlers.restore()

    with OnSignals((signal.SIGUSR1,), once) as handlers:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)  # the handler from before
    assert seen == [signal.SIGUSR1, -signal.SIGUSR1]
    assert signal.getsignal(signal.SIGUSR1) is before


def test_outside_the_main_thread_nothing_is_installed() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    result: list[bool] = []

    def run() -> None:
        with OnSignals((signal.SIGUSR1,), lambda signum: None) as handlers:
            result.append(handlers.installed)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert result == [False]
    assert signal.getsignal(signal.SIGUSR1) is before
