"""``promptyoself.signals.OnSignals``, the one helper behind Ctrl-C and SIGTERM (issue 20 point 7):
handlers for the block, in the main thread only, the previous ones back afterwards."""

from __future__ import annotations

import os
import signal
import threading

from promptyoself.signals import OnSignals


def test_the_callback_runs_and_the_previous_handlers_come_back() -> None:
    seen: list[int] = []

    def before(signum: int, frame: object) -> None:
        seen.append(-signum)

    old = signal.signal(signal.SIGUSR1, before)
    try:
        with OnSignals((signal.SIGUSR1, signal.SIGUSR2), seen.append) as handlers:
            assert handlers.installed
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGUSR2)
        assert seen == [signal.SIGUSR1, signal.SIGUSR2]
        assert signal.getsignal(signal.SIGUSR1) is before
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_restore_from_the_callback_puts_the_previous_handler_back_at_once() -> None:
    seen: list[int] = []

    def before(signum: int, frame: object) -> None:
        seen.append(-signum)

    old = signal.signal(signal.SIGUSR1, before)
    try:
        def once(signum: int) -> None:
            seen.append(signum)
            handlers.restore()

        with OnSignals((signal.SIGUSR1,), once) as handlers:
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGUSR1)  # the handler from before
        assert seen == [signal.SIGUSR1, -signal.SIGUSR1]
        assert signal.getsignal(signal.SIGUSR1) is before
    finally:
        signal.signal(signal.SIGUSR1, old)


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
