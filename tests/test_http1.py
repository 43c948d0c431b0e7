"""The send path's own HTTP/1.1 POST (``promptyoself.letta.http1``) against a scripted TCP server:
keep-alive reuse, the answer framings a server may choose, the failures and the httpx exception
each one maps to (which decides whether a send is in doubt), and the guard that writes nothing."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from promptyoself.letta.client import LettaClient
from promptyoself.letta.http1 import KeepAlivePoster, NotSent

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 13\r\n\r\n{\"id\":\"run\"}\n"
PATH = "/v1/agents/agent-1/messages/async"
BODY = b'{"messages":[{"role":"user","content":"x"}]}'

Action = bytes | Callable[[socket.socket], None]


class Scripted:
    """A TCP server that answers the n-th request it reads (over all connections) with ``script[n]``:
    bytes to send, or a function of the connection's socket (which may close it)."""

    def __init__(self, script: list[Action]) -> None:
        self.script = list(script)
        self.requests: list[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(rest) < length:
                    rest += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + rest[:length])
                buf = rest[length:]
                action = self.script.pop(0)
                if callable(action):
                    action(conn)
                else:
                    conn.sendall(action)
        except OSError:
            return
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[list[Action]], Scripted]]:
    made: list[Scripted] = []

    def make(script: list[Action]) -> Scripted:
        server = Scripted(script)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


def close(conn: socket.socket) -> None:
    conn.shutdown(socket.SHUT_RDWR)
    conn.close()


def test_two_posts_share_one_connection_and_send_what_httpx_would(serve: Any) -> None:
    server = serve([OK, OK])
    poster = KeepAlivePoster(server.url, {"Authorization": "Bearer k", "User-Agent": "t"}, 2.0)
    try:
        first = poster.post(PATH, BODY)
        second = poster.post(PATH, BODY)
    finally:
        poster.close()
    assert first.status_code == second.status_code == 200 and first.json() == {"id": "run"}
    assert server.connections == 1
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == f"POST {PATH} HTTP/1.1" and body == BODY
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert headers["host"] == server.url.split("//")[1] and headers["authorization"] == "Bearer k"
    assert headers["content-type"] == "application/json" and headers["content-length"] == str(len(BODY))


def test_a_base_path_prefixes_every_request(serve: Any) -> None:
    server = serve([OK])
    poster = KeepAlivePoster(server.url + "/letta/", {}, 2.0)
    try:
        poster.post(PATH, BODY)
    finally:
        poster.close()
    assert server.requests[0].startswith(f"POST /letta{PATH} HTTP/1.1".encode())


def test_chunked_and_close_delimited_bodies_and_an_interim_answer(serve: Any) -> None:
    chunked = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
               b"5\r\n{\"id\"\r\n8\r\n:\"run\"}\n\r\n0\r\n\r\n")
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" + OK

    def close_delimited(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{\"id\":\"run\"}")
        close(conn)

    server = serve([chunked, interim, close_delimited, OK])
    poster = KeepAlivePoster(server.url, {}, 2.0)
    try:
        answers = [poster.post(PATH, BODY) for _ in range(4)]
    finally:
        poster.close()
    assert [a.status_code for a in answers] == [200] * 4
    assert all(a.json() == {"id": "run"} for a in answers)
    assert server.connections == 2  # the close-delimited answer ended its connection; the next opened one


def test_connection_close_and_an_idle_close_by_the_server_open_a_new_connection(serve: Any) -> None:
    closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}"
    closed = threading.Event()

    def answer_then_close(conn: socket.socket) -> None:
        conn.sendall(OK)
        close(conn)  # idle keep-alive connection closed by the server, as uvicorn does after a timeout
        closed.set()

    server = serve([closing, answer_then_close, OK])
    poster = KeepAlivePoster(server.url, {}, 2.0)
    try:
        assert poster.post(PATH, BODY).json() == {}
        assert poster.post(PATH, BODY).status_code == 200
        assert closed.wait(5)
        threading.Event().wait(0.1)  # (loopback: the close has arrived)
        assert poster.post(PATH, BODY).status_code == 200
    finally:
        poster.close()
    assert server.connections == 3 and len(server.requests) == 3


def test_headers_are_lower_case_and_repeats_joined_and_the_client_reads_retry_after(serve: Any) -> None:
    busy = (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nX-A: 1\r\nX-A: 2\r\n"
            b"content-length: 20\r\n\r\n{\"detail\":\"slow on\"}")
    server = serve([busy, busy])
    poster = KeepAlivePoster(server.url, {}, 2.0)
    try:
        answer = poster.post(PATH, BODY)
    finally:
        poster.close()
    assert answer.status_code == 429 and answer.headers["retry-after"] == "7" and answer.headers["x-a"] == "1, 2"
    client = LettaClient(server.url, "k", timeout=2.0)
    try:
        with pytest.raises(Exception) as info:
            client.send_message("agent-1", "hi", otid="o")
    finally:
        client.close()
    assert info.value.details["retry_after"] == 7.0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("action", "error"),
    [
        (close, httpx.RemoteProtocolError),  # the request was read, no answer: in doubt
        (lambda c: (c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n{\"id\""), close(c)),
         httpx.RemoteProtocolError),  # the answer cut short
        (b"HTTP/1.1 2xx what\r\n\r\n", httpx.RemoteProtocolError),  # not HTTP
        (lambda c: threading.Event().wait(1.0), httpx.ReadTimeout),  # no answer in time
    ],
)
def test_failures_after_the_request_was_written_map_to_httpx_and_drop_the_connection(
    serve: Any, action: Action, error: type[Exception]
) -> None:
    server = serve([action, OK])
    poster = KeepAlivePoster(server.url, {}, 0.5)
    try:
        with pytest.raises(error):
            poster.post(PATH, BODY)
        assert poster.post(PATH, BODY).status_code == 200  # on a new connection
    finally:
        poster.close()
    assert server.connections == 2


def test_nothing_listening_is_a_connect_error_not_in_doubt() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    poster = KeepAlivePoster(f"http://127.0.0.1:{port}", {}, 1.0)
    try:
        with pytest.raises(httpx.ConnectError):
            poster.post(PATH, BODY)
    finally:
        poster.close()


def test_the_guard_saying_no_writes_nothing_and_keeps_the_connection(serve: Any) -> None:
    server = serve([OK, OK])
    poster = KeepAlivePoster(server.url, {}, 2.0)
    try:
        poster.post(PATH, BODY, guard=lambda: True)
        with pytest.raises(NotSent):
            poster.post(PATH, BODY, guard=lambda: False)
        poster.post(PATH, BODY)
    finally:
        poster.close()
    assert len(server.requests) == 2 and server.connections == 1


def test_a_closed_poster_refuses_to_connect(serve: Any) -> None:
    server = serve([OK])
    poster = KeepAlivePoster(server.url, {}, 2.0)
    poster.close()
    with pytest.raises(httpx.ConnectError):
        poster.post(PATH, BODY)


def test_what_it_cannot_send_as_is_goes_through_httpx() -> None:
    with pytest.raises(ValueError):
        KeepAlivePoster("https://example.org", {}, 1.0)
    with pytest.raises(ValueError):
        KeepAlivePoster("http://127.0.0.1:1", {"Authorization": "Bearer a\r\nX-Evil: 1"}, 1.0)
    with pytest.raises(ValueError):
        KeepAlivePoster("http://127.0.0.1:1/a path", {}, 1.0)
    client = LettaClient("http://127.0.0.1:1", "a\r\nX-Evil: 1")
    try:
        assert client._poster is None  # httpx decides what to do with such a header
    finally:
        client.close()
    assert LettaClient("http://127.0.0.1:1", "k")._poster is not None
