"""Logging: stderr always and never stdout; PROMPTYOSELF_LOG_FILE rotates; PROMPTYOSELF_LOG_JSON gives
JSON lines; PROMPTYOSELF_LOG_LEVEL filters. The stdio server is checked as a real subprocess: with
DEBUG logging on, every stdout line is JSON-RPC and the logs are on stderr."""

from __future__ import annotations

import io
import json
import logging
import os
import select
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from promptyoself.config import Settings
from promptyoself.logs import reset_logging, setup_logging
from tests.procs import PYTHON, SERVER_SCRIPT, server_env

log = logging.getLogger("promptyoself.test_logging")


@pytest.fixture(autouse=True)
def _clean_logging() -> Iterator[None]:
    yield
    reset_logging()


# ---- the stdio server as a subprocess ------------------------------------------------------------


class RawStdio:
    """Talk JSON-RPC to a stdio server line by line, keeping every byte it writes to stdout."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.stdout_lines: list[bytes] = []
        self._buf = b""

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def _read_line(self, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no reply from the server in time")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError("server closed stdout")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        self.stdout_lines.append(line)
        return line

    def request(self, rid: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        deadline = time.monotonic() + 30
        while True:
            message = json.loads(self._read_line(deadline))
            if message.get("id") == rid:
                return message

    def drain(self) -> None:
        """Read stdout to EOF (after stdin was closed)."""
        assert self.proc.stdout is not None
        rest = self.proc.stdout.read()
        self.stdout_lines.extend(line for line in (self._buf + rest).split(b"\n") if line)
        self._buf = b""


@pytest.mark.slow
def test_stdio_server_stdout_is_only_json_rpc_and_logs_go_to_stderr(tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "server.log"
    env = server_env(
        tmp_path / "stdio.db",
        PROMPTYOSELF_LOG_LEVEL="DEBUG",
        PROMPTYOSELF_LOG_JSON="true",
        PROMPTYOSELF_LOG_FILE=str(log_file),
    )
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([PYTHON, str(SERVER_SCRIPT)], env=env, cwd="/", stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    try:
        rpc = RawStdio(proc)
        init = rpc.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                             "clientInfo": {"name": "raw", "version": "0"}})
        assert init["result"]["serverInfo"]["name"] == "promptyoself"
        rpc.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools = rpc.request(2, "tools/list")
        assert any(t["name"] == "promptyoself_schedule_time" for t in tools["result"]["tools"])
        ok = rpc.request(3, "tools/call", {"name": "promptyoself_schedule_time", "arguments": {
            "prompt": "log me", "time": "in 5m", "agent_id": "agent-log", "skip_validation": True}})
        assert ok["result"]["isError"] is False
        bad = rpc.request(4, "tools/call", {"name": "promptyoself_schedule_time", "arguments": {
            "prompt": "log me", "time": "yesterday-ish", "agent_id": "agent-log", "skip_validation": True}})
        assert bad["result"]["isError"] is True
        assert proc.stdin is not None
        proc.stdin.close()  # EOF: the server shuts down by itself
        rpc.drain()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()

    # stdout: JSON-RPC messages and nothing else.
    assert len(rpc.stdout_lines) >= 4
    for line in rpc.stdout_lines:
        message = json.loads(line)
        assert message.get("jsonrpc") == "2.0", line

    # stderr: our logs, one JSON object per line, DEBUG included, from our code and from the SDK.
    stderr_lines = [ln for ln in err_path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    assert stderr_lines, "no logs on stderr"
    records = [json.loads(ln) for ln in stderr_lines]
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)
    assert any(r["level"] == "DEBUG" for r in records)
    assert any(r["logger"].startswith("mcp.") or r["logger"].startswith("fastmcp") for r in records)

    # The file got the same JSON lines.
    file_records = [json.loads(ln) for ln in log_file.read_text(encoding="utf-8").splitlines() if ln.strip()]
    assert len(file_records) == len(records)


# ---- in process -----------------------------------------------------------------------------------


def _settings(tmp_path: Path, **kw: Any) -> Settings:
    return Settings(db=str(tmp_path / "x.db"), **kw)


def test_stderr_always_and_never_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_file = tmp_path / "a.log"
    setup_logging(_settings(tmp_path, log_file=str(log_file)))
    log.info("hello %s", "world")
    logging.getLogger("fastmcp.server").warning("from fastmcp")
    logging.getLogger("uvicorn.error").info("from uvicorn")
    out, err = capsys.readouterr()
    assert out == ""
    assert "INFO promptyoself.test_logging: hello world" in err
    assert "from fastmcp" in err and "from uvicorn" in err
    text = log_file.read_text(encoding="utf-8")
    assert "hello world" in text and "from fastmcp" in text


def test_stderr_follows_a_replaced_sys_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setup_logging(_settings(tmp_path))
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    log.warning("one")
    monkeypatch.setattr("sys.stderr", second)
    log.warning("two")
    assert "one" in first.getvalue() and "two" not in first.getvalue()
    assert "two" in second.getvalue()


def test_setup_twice_does_not_duplicate(tmp_path: Path) -> None:
    stream = io.StringIO()
    setup_logging(_settings(tmp_path), stream=stream)
    setup_logging(_settings(tmp_path), stream=stream)
    log.warning("once")
    assert stream.getvalue().count("once") == 1


def test_log_file_rotates(tmp_path: Path) -> None:
    log_file = tmp_path / "nested" / "dir" / "rot.log"
    setup_logging(_settings(tmp_path, log_file=str(log_file), log_max_bytes=2048, log_backups=2),
                  stream=io.StringIO())
    for i in range(200):
        log.info("line %03d %s", i, "x" * 80)
    files = sorted(p.name for p in log_file.parent.iterdir())
    assert files == ["rot.log", "rot.log.1", "rot.log.2"]  # backups capped at 2
    for name in files:
        assert (log_file.parent / name).stat().st_size <= 2048
    assert "line 199" in log_file.read_text(encoding="utf-8")  # newest in the live file
    assert "line 000" not in "".join((log_file.parent / n).read_text() for n in files)  # oldest rotated away


def test_log_file_tilde_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    setup_logging(_settings(tmp_path, log_file="~/logs/p.log"), stream=io.StringIO())
    log.warning("tilde")
    assert "tilde" in (tmp_path / "home" / "logs" / "p.log").read_text(encoding="utf-8")


def test_json_lines(tmp_path: Path) -> None:
    stream = io.StringIO()
    log_file = tmp_path / "j.log"
    setup_logging(_settings(tmp_path, log_json=True, log_file=str(log_file)), stream=stream)
    log.info("plain %d", 42)
    try:
        raise KeyError("boom")
    except KeyError:
        log.exception("it failed")
    logging.getLogger("fastmcp").info('quote " and\nnewline')
    for text in (stream.getvalue(), log_file.read_text(encoding="utf-8")):
        lines = text.splitlines()
        assert len(lines) == 3  # a traceback or a newline never breaks a record over two lines
        first, second, third = (json.loads(ln) for ln in lines)
        assert first["msg"] == "plain 42" and first["level"] == "INFO"
        assert first["logger"] == "promptyoself.test_logging"
        assert first["ts"].endswith("+00:00")
        assert second["level"] == "ERROR" and "KeyError: 'boom'" in second["exc"]
        assert third["msg"] == 'quote " and\nnewline'


@pytest.mark.parametrize(("level", "shown", "hidden"), [
    ("DEBUG", ["debug", "info", "warning"], []),
    ("info", ["info", "warning"], ["debug"]),
    ("Warning", ["warning"], ["debug", "info"]),
    ("ERROR", [], ["debug", "info", "warning"]),
])
def test_log_level(tmp_path: Path, level: str, shown: list[str], hidden: list[str]) -> None:
    stream = io.StringIO()
    setup_logging(_settings(tmp_path, log_level=level), stream=stream)
    log.debug("msg-debug")
    log.info("msg-info")
    log.warning("msg-warning")
    for name in shown:
        assert f"msg-{name}" in stream.getvalue()
    for name in hidden:
        assert f"msg-{name}" not in stream.getvalue()


def test_log_level_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from promptyoself.config import ConfigError, load_settings

    monkeypatch.setenv("PROMPTYOSELF_LOG_LEVEL", "error")
    monkeypatch.setenv("PROMPTYOSELF_LOG_JSON", "1")
    monkeypatch.setenv("PROMPTYOSELF_LOG_MAX_BYTES", "4096")
    monkeypatch.setenv("PROMPTYOSELF_LOG_BACKUPS", "5")
    s = load_settings()
    assert (s.log_level, s.log_json, s.log_max_bytes, s.log_backups) == ("ERROR", True, 4096, 5)
    monkeypatch.setenv("PROMPTYOSELF_LOG_LEVEL", "chatty")
    with pytest.raises(ConfigError, match="PROMPTYOSELF_LOG_LEVEL"):
        load_settings()


def test_http_client_logs_stay_quiet(tmp_path: Path) -> None:
    """httpx logs request lines at INFO (and httpcore headers at DEBUG): kept at WARNING even at DEBUG."""
    stream = io.StringIO()
    setup_logging(_settings(tmp_path, log_level="DEBUG"), stream=stream)
    logging.getLogger("httpx").info("HTTP Request: GET http://letta/v1/agents/")
    logging.getLogger("httpcore.http11").debug("send_request_headers.started")
    log.debug("ours")
    assert "HTTP Request" not in stream.getvalue()
    assert "send_request_headers" not in stream.getvalue()
    assert "ours" in stream.getvalue()


def logged_warning(tmp_path: Path, text: str) -> str:
    """What logging set up on a stream of its own writes when ``text`` is warned."""
    import warnings

    stream = io.StringIO()
    setup_logging(_settings(tmp_path), stream=stream)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn(text, UserWarning, stacklevel=1)
    return stream.getvalue()


def test_warnings_are_logged_not_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "careful now" in logged_warning(tmp_path, "careful now")
    assert capsys.readouterr().out == ""


def test_warnings_are_logged_after_showwarning_was_put_back(tmp_path: Path) -> None:
    # What a test runner does between two tests that set up logging: its catch_warnings puts
    # warnings.showwarning back while logging still believes it captures (CI failed on this order).
    import warnings

    with warnings.catch_warnings():
        setup_logging(_settings(tmp_path), stream=io.StringIO())
    assert "careful again" in logged_warning(tmp_path, "careful again")
