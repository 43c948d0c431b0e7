"""Secrets never leak: the Letta key and password, the HTTP token and a password in a database URL
appear in no log line (caplog, the log file, stderr), no tool result, no error and not in ``health``
— through the in-memory MCP client, the CLI in process and the CLI as a subprocess, for successful
and failing calls (Letta refusing the credentials, an internal error)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastmcp import Client

from promptyoself.config import Settings, load_settings
from promptyoself.config import redact_url as _safe_url
from promptyoself.core.operations import Core
from promptyoself.faces import cli
from promptyoself.faces.mcp import build_server
from promptyoself.logs import RedactSecrets, reset_logging, settings_secrets, setup_logging

API_KEY = "sk-APIKEY-7c1f0e9b2d4a"
PASSWORD = "pw-LETTA-4e8a2b6d9c1f"
TOKEN = "tok-HTTP-9d3c5f1a7e2b"
DB_PASSWORD = "db-PASS/2b7e@9c4f:x"  # characters that URLs percent-encode
SECRETS = (API_KEY, PASSWORD, TOKEN, DB_PASSWORD)
PG_URL = f"postgresql+psycopg://promptyoself:{quote(DB_PASSWORD, safe='')}@127.0.0.1:1/pys"


def assert_clean(text: str, where: str) -> None:
    for secret in SECRETS:
        for form in {secret, quote(secret, safe=""), quote(secret)}:
            assert form not in text, f"secret {secret[:6]}... leaked into {where}"


@pytest.fixture(autouse=True)
def _clean_logging() -> Iterator[None]:
    yield
    reset_logging()


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_letta_refusing: Any) -> Path:
    """Every secret set in the environment; Letta (the fake) accepts none of them."""
    log_file = tmp_path / "logs" / "promptyoself.log"
    monkeypatch.setenv("LETTA_API_KEY", API_KEY)
    monkeypatch.setenv("LETTA_SERVER_PASSWORD", PASSWORD)
    monkeypatch.setenv("PROMPTYOSELF_HTTP_TOKEN", TOKEN)
    monkeypatch.setenv("LETTA_BASE_URL", fake_letta_refusing.url)
    monkeypatch.setenv("PROMPTYOSELF_DB", f"sqlite:///{tmp_path / 'secrets.db'}")
    monkeypatch.setenv("PROMPTYOSELF_EXECUTOR_MODE", "off")
    monkeypatch.setenv("PROMPTYOSELF_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("PROMPTYOSELF_LOG_FILE", str(log_file))
    return log_file


@pytest.fixture
def fake_letta_refusing() -> Iterator[Any]:
    from testkit.fake_letta import FakeLetta

    with FakeLetta(agents=1, password="the-real-letta-password") as fake:
        yield fake


def _texts(result: Any) -> str:
    parts = [getattr(c, "text", "") for c in result.content]
    if result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


async def _call_everything(core: Core, agent: str) -> tuple[str, dict[str, Any]]:
    """Call every kind of tool, successful and failing; return all result text and the error codes."""
    out: list[str] = []
    codes: dict[str, Any] = {}
    calls: list[tuple[str, dict[str, Any]]] = [
        ("health", {}),
        ("promptyoself_test", {}),
        ("promptyoself_agents", {}),
        ("promptyoself_upload", {"source_code": "def f(x: int) -> int:\n    '''Double.'''\n    return 2 * x\n"}),
        ("promptyoself_schedule_time", {"prompt": "validated", "time": "in 5m", "agent_id": agent}),
        ("promptyoself_schedule_time", {"prompt": "skipped", "time": "in 5m", "agent_id": agent,
                                        "skip_validation": True}),
        ("promptyoself_schedule_cron", {"prompt": "bad", "cron": "99 99 * * *", "agent_id": agent,
                                        "skip_validation": True}),
        ("promptyoself_list", {}),
        ("promptyoself_history", {}),
        ("promptyoself_inference_diagnostics", {}),
        ("promptyoself_cancel", {"schedule_id": 999999}),
        ("promptyoself_schedule_time", {"prompt": "who", "time": "in 5m", "skip_validation": True}),
    ]
    async with Client(build_server(core)) as client:
        for name, args in calls:
            result = await client.call_tool(name, args, raise_on_error=False)
            text = _texts(result)
            out.append(text)
            if result.is_error:
                codes.setdefault(name, []).append(json.loads(result.content[0].text)["code"])
    return "\n".join(out), codes


@pytest.mark.slow
async def test_tool_calls_never_leak(secret_env: Path, fake_letta_refusing: Any,
                                     caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG)
    settings = load_settings()
    setup_logging(settings)
    core = Core(settings)
    try:
        agent = fake_letta_refusing.agent_ids[0]
        results, codes = await _call_everything(core, agent)

        # An internal error (a bug) is reported as `internal`, with the details only in the log.
        def explode(*_a: Any, **_k: Any) -> Any:
            raise RuntimeError("the database exploded")

        monkeypatch.setattr(core.scheduling, "list_schedules", explode)
        async with Client(build_server(core)) as client:
            broken = await client.call_tool("promptyoself_list", {}, raise_on_error=False)
        health = (await core.health())
    finally:
        core.close()

    assert codes["promptyoself_test"] == ["letta_auth"]
    assert codes["promptyoself_agents"] == ["letta_auth"]
    assert codes["promptyoself_upload"] == ["letta_auth"]
    assert codes["promptyoself_schedule_time"] == ["letta_auth", "agent_required"]
    assert codes["promptyoself_schedule_cron"] == ["invalid_cron"]
    assert broken.is_error and json.loads(broken.content[0].text)["code"] == "internal"
    assert health["auth_set"] is True

    # The key really was sent to Letta, so the checks below are not vacuous.
    sent = [d["headers"].get("Authorization") for d in fake_letta_refusing.request_details]
    assert f"Bearer {API_KEY}" in sent

    out, err = capsys.readouterr()
    log_text = secret_env.read_text(encoding="utf-8")
    assert "the database exploded" in log_text  # the log has the details...
    assert "the database exploded" not in _texts(broken)  # ...the client does not
    assert "Traceback" not in results + _texts(broken)
    assert "HTTP Request" not in log_text  # httpx stays at WARNING even at DEBUG
    for text, where in [
        (results, "tool results"),
        (_texts(broken), "internal error result"),
        (json.dumps(health), "health"),
        (caplog.text, "caplog"),
        ("\n".join(str(r.__dict__) for r in caplog.records), "log records"),
        (log_text, "log file"),
        (err, "stderr"),
        (out, "stdout"),
    ]:
        assert_clean(text, where)
    assert out == ""


@pytest.mark.slow
async def test_secret_inside_an_exception_is_redacted(secret_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Defence in depth: even if a library puts a secret into an exception, handlers redact it."""
    settings = load_settings()
    setup_logging(settings)
    core = Core(settings)

    def leaky(*_a: Any, **_k: Any) -> Any:
        raise ConnectionError(f"login with {API_KEY} / {quote(PASSWORD, safe='')} / {TOKEN} failed")

    monkeypatch.setattr(core.scheduling, "history", leaky)
    try:
        async with Client(build_server(core)) as client:
            result = await client.call_tool("promptyoself_history", {}, raise_on_error=False)
    finally:
        core.close()
    _, err = capsys.readouterr()
    log_text = secret_env.read_text(encoding="utf-8")
    assert "login with *** / *** / *** failed" in log_text
    assert "ConnectionError" in err
    for text, where in [(_texts(result), "result"), (log_text, "log file"), (err, "stderr")]:
        assert_clean(text, where)


@pytest.mark.slow
def test_cli_never_leaks(secret_env: Path, fake_letta_refusing: Any, capsys: pytest.CaptureFixture[str]) -> None:
    agent = fake_letta_refusing.agent_ids[0]
    runs = [
        (["test", "--json"], 1),
        (["agents", "--json"], 1),
        (["schedule", "--prompt", "p", "--time", "in 5m", "--agent-id", agent, "--json"], 1),
        (["schedule", "--prompt", "p", "--time", "in 5m", "--agent-id", agent, "--skip-validation", "--json"], 0),
        (["list", "--json"], 0),
        (["health", "--json"], 1),  # degraded: Letta refuses the credentials
        (["cancel", "424242", "--json"], 1),
    ]
    outputs = []
    for argv, code in runs:
        assert cli.main(argv) == code, argv
        out, err = capsys.readouterr()
        outputs.append((argv, out, err))
        reset_logging()
    for argv, out, err in outputs:
        assert_clean(out, f"stdout of {argv}")
        assert_clean(err, f"stderr of {argv}")
        assert "Traceback" not in out
    assert json.loads(outputs[0][1])["code"] == "letta_auth"
    assert_clean(secret_env.read_text(encoding="utf-8"), "log file")


@pytest.mark.slow
def test_cli_subprocess_never_leaks(secret_env: Path, tmp_path: Path) -> None:
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "promptyoself", "test", "--json"],
        env=dict(os.environ), cwd=str(tmp_path), capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["code"] == "letta_auth"
    assert_clean(proc.stdout, "stdout")
    assert_clean(proc.stderr, "stderr")
    assert_clean(secret_env.read_text(encoding="utf-8"), "log file")


# ---- database URLs with a password ----------------------------------------------------------------


def test_database_url_password_is_hidden_without_connecting() -> None:
    from promptyoself.store.db import Store, make_engine

    store = Store.__new__(Store)  # no migration, no connection: only the engine (which connects lazily)
    store.url = PG_URL
    store.engine = make_engine(PG_URL)
    try:
        shown = store.describe()
    finally:
        store.engine.dispose()
    assert shown.startswith("postgresql+psycopg://promptyoself:***@127.0.0.1:1/pys")
    assert_clean(shown, "Store.describe")
    assert_clean(_safe_url(PG_URL), "_safe_url")

    # the start-up log line shows the URLs through the same helper
    assert _safe_url(PG_URL) == "postgresql+psycopg://promptyoself:***@127.0.0.1:1/pys"
    assert _safe_url(f"http://letta:{PASSWORD}@127.0.0.1:8283") == "http://letta:***@127.0.0.1:8283"
    assert _safe_url("http://localhost:8283") == "http://localhost:8283"

    settings = Settings(db=PG_URL)
    assert DB_PASSWORD in settings_secrets(settings)
    assert_clean(repr(settings), "repr(settings)")


def test_redaction_filter_covers_messages_args_and_tracebacks() -> None:
    settings = Settings(db=PG_URL, letta_api_key=API_KEY, letta_server_password=PASSWORD, http_token=TOKEN)
    redactor = RedactSecrets(settings_secrets(settings))
    try:
        raise ValueError(f"cannot connect to {PG_URL} with {PASSWORD}")
    except ValueError:
        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "url=%s key=%s token=%r", (PG_URL, API_KEY, TOKEN),
                                   sys.exc_info())
    assert redactor.filter(record)
    formatted = logging.Formatter().format(record)
    assert "***" in formatted
    assert_clean(formatted, "formatted record")

    from promptyoself.logs import JsonFormatter

    record2 = logging.LogRecord("t", logging.INFO, __file__, 1, "raw %s", (DB_PASSWORD,), None)
    redactor.filter(record2)
    assert_clean(JsonFormatter().format(record2), "json record")


async def test_unreachable_postgres_fails_without_leaking(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A real failure path: nothing listens on 127.0.0.1:1, so opening the store fails inside a tool."""
    pytest.importorskip("psycopg")
    caplog.set_level(logging.DEBUG)
    log_file = tmp_path / "pg.log"
    settings = Settings(db=PG_URL, executor_autostart=False, log_file=str(log_file), log_level="DEBUG",
                        letta_api_key=API_KEY)
    setup_logging(settings)
    core = Core(settings)
    try:
        async with Client(build_server(core)) as client:
            result = await client.call_tool("promptyoself_list", {"agent_id": "agent-x"}, raise_on_error=False)
            health = await client.call_tool("health", {}, raise_on_error=False)
    finally:
        core.close()
    assert result.is_error and json.loads(result.content[0].text)["code"] == "database_unavailable"
    verdict = json.loads(health.content[0].text)  # health itself answers: down, with the reason
    assert not health.is_error and verdict["status"] == "down"
    assert verdict["reasons"][0]["code"] == "database_unavailable"
    _, err = capsys.readouterr()
    for text, where in [(_texts(result), "result"), (_texts(health), "health"), (caplog.text, "caplog"),
                        (err, "stderr"),
                        (log_file.read_text(encoding="utf-8"), "log file")]:
        assert_clean(text, where)
