"""Helpers for tests that run the server as a real subprocess: paths, free ports, start/stop, README blocks."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SERVER_SCRIPT = REPO / "promptyoself_mcp_server.py"
_VENV_PYTHON = REPO / ".venv" / "bin" / "python"
PYTHON = str(_VENV_PYTHON) if _VENV_PYTHON.exists() else sys.executable
README_FASTMCP = REPO / "README_FASTMCP.md"

# Placeholders README_FASTMCP.md uses; tests substitute the real checkout.
DOC_CHECKOUT = "/home/you/promptyoself"

START_TIMEOUT = 30.0


def json_blocks(markdown: Path) -> list[Any]:
    """Every ```json fenced block of a Markdown file, parsed."""
    text = markdown.read_text(encoding="utf-8")
    return [json.loads(m) for m in re.findall(r"^```json\n(.*?)^```", text, re.S | re.M)]


def doc_path(value: str) -> str:
    """A path from the README with the placeholder checkout replaced by this repository."""
    if value == f"{DOC_CHECKOUT}/.venv/bin/python":
        return PYTHON
    if value.startswith(DOC_CHECKOUT + "/"):
        return str(REPO / value[len(DOC_CHECKOUT) + 1 :])
    return value


def read_all(fd: int, proc: subprocess.Popen[bytes], timeout: float = 120) -> bytes:
    """Everything ``proc`` writes to ``fd`` (a pty's master end) until it closes the terminal or
    exits, or ``timeout`` seconds pass."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    return b"".join(chunks)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(db: Path, **extra: str) -> dict[str, str]:
    """The test process's (already isolated) environment plus a private DB and no delivery."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMPTYOSELF_", "LETTA_"))}
    env.update(
        PROMPTYOSELF_DB=str(db),
        PROMPTYOSELF_EXECUTOR_MODE="off",
        PROMPTYOSELF_ENV_FILE=str(db.parent / "absent.env"),
        LETTA_BASE_URL="http://127.0.0.1:9",  # nothing listens there; no test reaches Letta by accident
    )
    env.update(extra)
    return env


def bare_env(db: Path, **extra: str) -> dict[str, str]:
    """Only PATH and HOME of this process (as a desktop client starts a server), a private DB, no
    delivery and a Letta where nothing listens; ``extra`` on top."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/root"),
        "PROMPTYOSELF_DB": str(db),
        "PROMPTYOSELF_EXECUTOR_MODE": "off",
        "PROMPTYOSELF_ENV_FILE": str(db.parent / "none.env"),
        "LETTA_BASE_URL": "http://127.0.0.1:9",  # nothing listens: validation is skipped by the callers
    }
    env.update(extra)
    return env


class ServerProcess:
    """``python promptyoself_mcp_server.py ARGS`` in its own process group, stderr to a file."""

    def __init__(self, args: list[str], env: dict[str, str], workdir: Path) -> None:
        self.args = args
        self.env = env
        self.stderr_path = workdir / f"server-{os.getpid()}-{time.monotonic_ns()}.stderr"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [PYTHON, str(SERVER_SCRIPT), *self.args],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                cwd="/",
            )
        return self

    def wait_port(self, port: int, timeout: float = START_TIMEOUT) -> None:
        """Wait until 127.0.0.1:port accepts connections (fail early if the server died)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.stderr()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
            time.sleep(0.05)
        raise AssertionError(f"server did not listen on {port} within {timeout}s:\n{self.stderr()}")

    def wait_exit(self, timeout: float = START_TIMEOUT) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after 5 s; always reaps."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            if proc is not None and proc.stdout:
                proc.stdout.close()
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        if proc.stdout:
            proc.stdout.close()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_server(args: list[str], env: dict[str, str], workdir: Path, port: int) -> Iterator[ServerProcess]:
    with ServerProcess(args, env, workdir) as server:
        server.wait_port(port)
        yield server
