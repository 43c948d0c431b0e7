"""Ctrl-C and the terminal (issue 12 point 3), through a real pseudo-terminal.

Each long-running command (the stdio MCP server, ``serve``, ``worker``, ``execute --loop``) runs as
the foreground process of its own terminal (os.openpty, the child's controlling terminal); the test
types Ctrl-C (``\\x03``), which the terminal turns into SIGINT. Each must exit 130 with no traceback.
The stdio server started on a terminal says in one line on stderr what it is; started by a client
(stdin a pipe, as Letta and Claude Desktop do) it says nothing, and stdout carries only JSON-RPC.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from tests.helpers_delivery import SERVER, child_env, kill_all, reap, subreaper

pytestmark = pytest.mark.slow

READY_TIMEOUT = 90.0  # start-up under a loaded machine
HINT = "promptyoself: this is the MCP server; it speaks MCP (JSON-RPC) on stdin/stdout"


def _as_terminal_foreground() -> None:
    """In the child: default SIGINT (a test runner may have it ignored), a new session, and the pty
    on stdin as the controlling terminal, so Ctrl-C typed into it reaches the child as SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """A command on a pseudo-terminal (stdin and stderr; stdout too unless ``stdout_pipe``)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path, *, stdout_pipe: bool = False) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            args, stdin=slave, stdout=subprocess.PIPE if stdout_pipe else slave, stderr=slave, env=env,
            cwd=str(cwd), preexec_fn=_as_terminal_foreground,
        )
        os.close(slave)
        self.output = b""

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: every process holding the terminal is gone
            return False
        self.output += chunk
        return bool(chunk)

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    def wait_for(self, marker: str, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.text:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self._read(0.2)
                raise AssertionError(f"{marker!r} did not appear; output:\n{self.text}")
            self._read(0.1)

    def ctrl_c(self, timeout: float = 30.0) -> int:
        os.write(self.master, b"\x03")
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.1)
        while self._read(0.05):  # what is left in the terminal
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            raise AssertionError(f"still running {timeout}s after Ctrl-C; output:\n{self.text}")
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        os.close(self.master)


@pytest.fixture
def db(tmp_path: Path):
    path = tmp_path / "sigint.db"
    with subreaper():
        yield path
        kill_all(path)
        reap()


def env_for(db: Path, **extra: str) -> dict[str, str]:
    return child_env(db, "http://127.0.0.1:9", PROMPTYOSELF_LOG_LEVEL="INFO", **extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_interrupted(term: Terminal, code: int) -> None:
    assert code == 130, term.text
    assert "Traceback" not in term.text and "KeyboardInterrupt" not in term.text, term.text


def test_stdio_server_on_a_terminal_says_what_it_is_and_ctrl_c_exits_130(db: Path, tmp_path: Path) -> None:
    term = Terminal([sys.executable, str(SERVER)], env_for(db), tmp_path, stdout_pipe=True)
    try:
        term.wait_for("Starting MCP server")
        hints = [line for line in term.text.splitlines() if HINT in line]
        assert len(hints) == 1, term.text
        assert "README_FASTMCP.md" in hints[0] and "`promptyoself --help`" in hints[0]
        assert_interrupted(term, term.ctrl_c())
        assert term.proc.stdout is not None and term.proc.stdout.read() == b""  # stdout: JSON-RPC only
    finally:
        term.close()


def test_stdio_server_delivering_in_process_stops_delivery_then_exits_130(db: Path, tmp_path: Path) -> None:
    env = env_for(db, PROMPTYOSELF_EXECUTOR_MODE="embedded")
    term = Terminal([sys.executable, str(SERVER)], env, tmp_path, stdout_pipe=True)
    try:
        term.wait_for("delivery loop embedded:")  # the deferred start, ~2 s after start-up
        assert_interrupted(term, term.ctrl_c())
        assert "stopped" in term.text.split("delivery loop embedded:", 1)[1], term.text  # a graceful stop
    finally:
        term.close()


@pytest.mark.parametrize(
    ("args", "ready", "extra"),
    [
        (["serve", "--port", "{port}"], "Application startup complete", {}),
        (["serve", "--transport", "http", "--port", "{port}"], "Uvicorn running on", {}),
        (["worker"], "delivery loop worker:", {"PROMPTYOSELF_WORKER_IDLE_EXIT": "0"}),
        (["execute", "--loop"], "delivery loop execute:", {}),
    ],
    ids=["serve", "serve-http", "worker", "execute-loop"],
)
def test_long_running_commands_exit_130_on_ctrl_c(
    db: Path, tmp_path: Path, args: list[str], ready: str, extra: dict[str, str]
) -> None:
    port = str(free_port())
    argv = [sys.executable, "-m", "promptyoself", *(a.replace("{port}", port) for a in args)]
    term = Terminal(argv, env_for(db, **extra), tmp_path)
    try:
        term.wait_for(ready)
        assert_interrupted(term, term.ctrl_c())
    finally:
        term.close()


def test_stdio_server_run_by_a_client_says_nothing_and_sigint_exits_130(db: Path, tmp_path: Path) -> None:
    """stdin a pipe (Letta, Claude Desktop): no hint, stdout only JSON-RPC; SIGINT still ends it cleanly."""
    proc = subprocess.Popen([sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env_for(db), cwd=str(tmp_path),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}}).encode() + b"\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert json.loads(line)["id"] == 1
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
        rest = proc.stdout.read()
        assert proc.stderr is not None
        err = proc.stderr.read().decode(errors="replace")
        assert code == 130, err
        assert "Traceback" not in err and HINT not in err, err
        assert rest == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                f.close()
