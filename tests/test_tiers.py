"""The test tiers stay honest: a fast test that spawns a process or listens on a socket is refused
(tests/conftest.py), and the tests assert states, never wall-clock durations."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import _GUARD

FORK_LINE = next(
    i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if line.endswith("# FORK_LINE")
)
REFUSED = r"mark it @pytest\.mark\.slow"


def refusals() -> list[str]:
    """What the guard refused so far in this test, taken (so that this test itself passes)."""
    assert _GUARD.active, "the guard is active in a test not marked slow"
    taken = list(_GUARD.seen)
    _GUARD.seen.clear()
    return taken


def test_a_fast_test_may_not_start_a_subprocess() -> None:
    with pytest.raises(RuntimeError, match=REFUSED):
        subprocess.run(["true"], check=False)
    assert [r.split(" (at ")[0] for r in refusals()] == ["start a subprocess"]


async def test_a_fast_test_may_not_start_an_asyncio_subprocess() -> None:
    with pytest.raises(RuntimeError, match=REFUSED):
        await asyncio.create_subprocess_exec("true")
    assert [r.split(" (at ")[0] for r in refusals()] == ["start a subprocess"]


def test_a_fast_test_may_not_fork() -> None:
    with pytest.raises(RuntimeError, match=REFUSED):
        os.fork()  # FORK_LINE
    assert refusals() == [f"call os.fork (at tests/test_tiers.py:{FORK_LINE})"]


def test_a_fast_test_may_not_listen() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        with pytest.raises(RuntimeError, match=REFUSED):
            sock.listen()
    assert [r.split(" (at ")[0] for r in refusals()] == ["listen on a socket (a real server)"]


def test_a_fast_test_may_use_a_socket_pair_and_threads() -> None:
    """In-process transports (socketpair, as asyncio's own loop uses) are allowed."""
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"x")
        assert b.recv(1) == b"x"
    assert _GUARD.seen == []


@pytest.mark.slow
def test_a_slow_test_may_start_a_subprocess() -> None:
    assert not _GUARD.active
    assert subprocess.run(["true"], check=False).returncode == 0
