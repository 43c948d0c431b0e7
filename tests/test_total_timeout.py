"""PROMPTYOSELF_LETTA_TIMEOUT is the whole request's, not one read's (issue 23, point 5): a Letta that
trickles a byte every 0.3 s (faster than any per-read timeout fires) held one send for 11 minutes
with a 3 s timeout. A real socket server trickles the head or the body; a send and a read (both through
httpx since the send's own HTTP/1.1 path was removed, issue 20) each give up at the deadline."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from promptyoself.errors import TargetUnavailable
from promptyoself.letta.client import LettaClient

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)

AGENT = "agent-11111111-2222-3333-4444-555555555555"
TIMEOUT = 1.5


class Trickler:
    """Accepts connections; answers each request one byte every ``every`` seconds, for ever."""

    def __init__(self, answer: bytes, every: float = 0.3) -> None:
        self.answer = answer
        self.every = every
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(65536)
                i = 0
                while not self.stop.is_set():
                    conn.sendall(self.answer[i % len(self.answer):][:1])
                    i += 1
                    time.sleep(self.every)
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


HEAD = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000
BODY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n[" + b" " * 99_999


@pytest.fixture(params=[HEAD, BODY], ids=["head", "body"])
def trickler(request: pytest.FixtureRequest) -> Iterator[Trickler]:
    t = Trickler(request.param)
    yield t
    t.close()


def gives_up(call: Callable[[], object]) -> BaseException:
    """What ``call`` raised. The trickle never ends, so only a whole-request deadline ends the call; if
    it has not ended after a generous minute (``TIMEOUT`` is 1.5 s), it never would."""
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(call)
        error = future.exception(timeout=60)
    assert error is not None, "the call returned an answer the trickle never finished"
    return error


def test_a_trickled_send_gives_up_at_the_deadline(trickler: Trickler) -> None:
    client = LettaClient(f"http://127.0.0.1:{trickler.port}", timeout=TIMEOUT)
    error = gives_up(lambda: client.send_message(AGENT, "hi", otid="k-1"))
    client.close()
    assert isinstance(error, TargetUnavailable), error
    assert error.details.get("in_doubt") is True  # written, then no whole answer: ask before resending


def test_a_trickled_read_gives_up_at_the_deadline(trickler: Trickler) -> None:
    client = LettaClient(f"http://127.0.0.1:{trickler.port}", timeout=TIMEOUT)
    for _ in range(2):  # a new connection, then (where one was kept) a kept one
        error = gives_up(lambda: client.list_agents(limit=1))
        assert isinstance(error, TargetUnavailable) and "did not answer in time" in str(error), error
    client.close()
