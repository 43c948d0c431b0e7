"""Every setting is parsed into its type when the settings load (issue 8 point 4).

For each variable: a good value loads as the parsed type, a bad value stops the CLI with exit code 2,
nothing on stdout and one stderr line naming the variable and what it accepts (never the value).
The docs and .env.example state exactly what the code accepts. Each entry point (the stdio server,
``serve``, a CLI command, the worker, and the worker the server spawns) stops the same way.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import SecretStr

from promptyoself import config
from promptyoself.config import ConfigError, Interval, Settings, load_settings, read_plugin_settings
from promptyoself.targets.claude_code.settings import ClaudeCodeSettings
from promptyoself.targets.codex.settings import CodexSettings
from promptyoself.targets.letta_code.settings import LettaCodeSettings
from tests.procs import PYTHON, REPO, SERVER_SCRIPT

CONFIG_DOC = REPO / "docs" / "configuration.md"
ENV_EXAMPLE = REPO / ".env.example"


def _secret(value: str) -> Any:
    return lambda got: isinstance(got, SecretStr) and got.get_secret_value() == value


# env var -> (bad value, good value, the parsed value or a predicate on it)
CASES: dict[str, tuple[str, str, Any]] = {
    "LETTA_BASE_URL": ("localhost:8283", "https://letta.example:8443/base", "https://letta.example:8443/base"),
    "LETTA_API_KEY": ("sk-\x01abc", "sk-abc", _secret("sk-abc")),
    "LETTA_SERVER_PASSWORD": ("pass\nword", "pass word", _secret("pass word")),
    "PROMPTYOSELF_LETTA_TIMEOUT": ("soon", "2.5", 2.5),
    "LETTA_CODE_URL": ("http://127.0.0.1:4500", " ws://127.0.0.1:4500 ", "ws://127.0.0.1:4500"),
    "PROMPTYOSELF_LETTA_CODE_TURN_TIMEOUT": ("0", "15m", 900.0),
    "PROMPTYOSELF_CLAUDE_BIN": ("claude\x01", " /opt/claude/bin/claude ", "/opt/claude/bin/claude"),
    "PROMPTYOSELF_CLAUDE_ARGS": ("--allowedTools 'Bash", "--allowedTools Bash", "--allowedTools Bash"),
    "PROMPTYOSELF_CLAUDE_TIMEOUT": ("never", "5m", 300.0),
    "PROMPTYOSELF_CODEX_BIN": ("codex\x01", " /opt/codex/bin/codex ", "/opt/codex/bin/codex"),
    "PROMPTYOSELF_CODEX_ARGS": ("--sandbox 'x", "--sandbox workspace-write", "--sandbox workspace-write"),
    "PROMPTYOSELF_CODEX_TIMEOUT": ("never", "5m", 300.0),
    "PROMPTYOSELF_DB": ("mysql://u@db.example/pys", "postgresql+psycopg://u@db.example/pys",
                        lambda s: s == "postgresql+psycopg://u@db.example/pys"),
    "PROMPTYOSELF_TIMEZONE": ("Mars/Base", "Europe/Berlin", ZoneInfo("Europe/Berlin")),
    "PROMPTYOSELF_EXECUTOR_MODE": ("sometimes", "Embedded", "embedded"),
    "PROMPTYOSELF_EXECUTOR_AUTOSTART": ("maybe", "no", False),
    "PROMPTYOSELF_EXECUTOR_INTERVAL": ("0", "0.5", 0.5),
    "PROMPTYOSELF_WORKER_IDLE_EXIT": ("-1", "10m", 600.0),
    "PROMPTYOSELF_LEASE_SECONDS": ("inf", "90s", 90.0),
    "PROMPTYOSELF_MAX_IN_FLIGHT": ("0", "3", 3),
    "PROMPTYOSELF_TARGET_IN_FLIGHT": ("claude-code=0", "Claude-Code=2, webhook=4", "claude-code=2,webhook=4"),
    "PROMPTYOSELF_MAX_ATTEMPTS": ("many", "5", 5),
    "PROMPTYOSELF_RETRY_BASE": ("nan", "1.5", 1.5),
    "PROMPTYOSELF_OVERLAP_POLL": ("0", "2s", 2.0),
    "PROMPTYOSELF_RETRY_MAX": ("-5", "1h", 3600.0),
    "PROMPTYOSELF_RETRY_AFTER_MAX": ("0", "2m", 120.0),
    "PROMPTYOSELF_MISFIRE_GRACE": ("bogus", "1h30m", timedelta(hours=1, minutes=30)),
    "PROMPTYOSELF_MESSAGE_FORMAT": ("fancy", "PLAIN", "plain"),
    "PROMPTYOSELF_STDIO_RELAY": ("sometimes", "OFF", "off"),
    "PROMPTYOSELF_DEFAULT_AGENT_ID": ("agent with spaces", "agent-123", "agent-123"),
    "LETTA_AGENT_ID": ("a" * 101, "agent-abc", "agent-abc"),
    "LETTA_DEFAULT_AGENT_ID": ("agent-\u00e9t\u00e9", " agent-def ", "agent-def"),
    "PROMPTYOSELF_USE_SINGLE_AGENT_FALLBACK": ("sure", "yes", True),
    "PROMPTYOSELF_MAX_ACTIVE_PER_AGENT": ("-3", "7", 7),
    "PROMPTYOSELF_MIN_INTERVAL": ("500ms", "1m", timedelta(minutes=1)),
    "PROMPTYOSELF_MAX_PROMPT_CHARS": ("lots", "100", 100),
    "PROMPTYOSELF_MAX_PAYLOAD_BYTES": ("1000", "65536", 65536),
    "PROMPTYOSELF_KEEP_ENDED": ("forever", "3d", timedelta(days=3)),
    "PROMPTYOSELF_KEEP_HISTORY": ("0", "off", None),
    "PROMPTYOSELF_MAX_DELIVERIES_PER_AGENT_PER_DAY": ("-1", "0", 0),
    "PROMPTYOSELF_MAX_SCHEDULES_PER_AGENT_PER_HOUR": ("ten", "12", 12),
    "PROMPTYOSELF_APPROVAL_BELOW": ("soon", "15m", timedelta(minutes=15)),
    "PROMPTYOSELF_LOG_LEVEL": ("LOUD", "warning", "WARNING"),
    "PROMPTYOSELF_LOG_FILE": ("/var/log/promptyoself/", "~/logs/p.log", "HOME/logs/p.log"),
    "PROMPTYOSELF_LOG_JSON": ("2", "TRUE", True),
    "PROMPTYOSELF_LOG_MAX_BYTES": ("1023", "4096", 4096),
    "PROMPTYOSELF_LOG_BACKUPS": ("101", "100", 100),
    "PROMPTYOSELF_HTTP_TOKEN": ("tok\x7fen", "t0ken", _secret("t0ken")),
    "PROMPTYOSELF_AGENT_TOKEN": ("pys_agent_\x7f", "pys_agent_t0ken", _secret("pys_agent_t0ken")),
    "PROMPTYOSELF_LETTA_PROXY": ("proxy", "off", False),
    "PROMPTYOSELF_ALLOWED_HOSTS": ("a b", "Promptyoself, [::1]", "promptyoself,[::1]"),
    "PROMPTYOSELF_TRUSTED_PROXIES": ("proxy.example", " 127.0.0.1, 10.0.0.0/8 ", "127.0.0.1,10.0.0.0/8"),
    "PROMPTYOSELF_MAX_REQUEST_BYTES": ("1000", "65536", 65536),
    "PROMPTYOSELF_MCP_SESSION_IDLE": ("0", "5m", 300.0),
    "PROMPTYOSELF_MCP_MAX_SESSIONS": ("0", "20", 20),
    "PROMPTYOSELF_HTTP_HEADER_TIMEOUT": ("nan", "2.5", 2.5),
    "PROMPTYOSELF_HTTP_MAX_CONNECTIONS": ("15", "2000", 2000),
    "PROMPTYOSELF_HEALTH_MAX_LATENESS": ("0", "PT2M", timedelta(minutes=2)),
    "PROMPTYOSELF_HEALTH_LETTA_CACHE": ("-1", "0", 0.0),
    "PROMPTYOSELF_PAUSE_AFTER_FAILURES": ("-1", "3", 3),
    "PROMPTYOSELF_MAX_TOKENS_PER_AGENT_PER_DAY": ("1.5", "250000", 250000),
    "PROMPTYOSELF_MAX_COST_USD_PER_AGENT_PER_DAY": ("inf", "2.50", 2.5),
    "PROMPTYOSELF_APPROVAL_ASK_TIMEOUT": ("soon", "2m", 120.0),
    "PROMPTYOSELF_ALERT_URL": ("ftp://alerts.example/x", " https://alerts.example/hook ", "https://alerts.example/hook"),
    "PROMPTYOSELF_ALERT_SECRET": ("secret-without-prefix", "whsec_dGhlLXNlY3JldA==", _secret("whsec_dGhlLXNlY3JldA==")),
}
PAIRED = {  # set together: one without the other stops every entry point (a test of its own)
    "PROMPTYOSELF_ALERT_URL": ("PROMPTYOSELF_ALERT_SECRET", "whsec_dGhlLXNlY3JldA=="),
    "PROMPTYOSELF_ALERT_SECRET": ("PROMPTYOSELF_ALERT_URL", "https://alerts.example/hook"),
}

TARGET_SETTINGS: dict[type[Any], str] = {LettaCodeSettings: "letta-code", ClaudeCodeSettings: "claude-code",
                                          CodexSettings: "codex"}
"""The built-in targets' own settings classes (each read by its plug-in, not at start) and their target."""
MODELS: dict[str, type[Any]] = {str(f.validation_alias): model for model in (Settings, *TARGET_SETTINGS)
                                for f in model.model_fields.values()}
"""Every variable -> the settings class that reads it."""
FIELDS = {str(f.validation_alias): name for model in (Settings, *TARGET_SETTINGS)
          for name, f in model.model_fields.items()}
TARGET_VARS = sorted(env for env, model in MODELS.items() if model is not Settings)


def accepts(env: str) -> str:
    return config.accepts(env, MODELS[env])


def read(env: str) -> Any:
    """What the variable loads as, read by the class that owns it."""
    model = MODELS[env]
    return getattr(load_settings() if model is Settings else read_plugin_settings(model), FIELDS[env])
TYPES = {  # the type each kind of setting loads as
    timedelta: ("PROMPTYOSELF_MISFIRE_GRACE", "PROMPTYOSELF_MIN_INTERVAL", "PROMPTYOSELF_HEALTH_MAX_LATENESS"),
    float: ("PROMPTYOSELF_LETTA_TIMEOUT", "PROMPTYOSELF_EXECUTOR_INTERVAL", "PROMPTYOSELF_WORKER_IDLE_EXIT",
            "PROMPTYOSELF_LEASE_SECONDS", "PROMPTYOSELF_RETRY_BASE", "PROMPTYOSELF_RETRY_MAX",
            "PROMPTYOSELF_RETRY_AFTER_MAX", "PROMPTYOSELF_OVERLAP_POLL",
            "PROMPTYOSELF_HEALTH_LETTA_CACHE", "PROMPTYOSELF_LETTA_CODE_TURN_TIMEOUT",
            "PROMPTYOSELF_CLAUDE_TIMEOUT", "PROMPTYOSELF_HTTP_HEADER_TIMEOUT",
            "PROMPTYOSELF_CODEX_TIMEOUT", "PROMPTYOSELF_APPROVAL_ASK_TIMEOUT"),
    ZoneInfo: ("PROMPTYOSELF_TIMEZONE",),
    Path: ("PROMPTYOSELF_LOG_FILE",),
}


def the_line(*names: str) -> str:
    return "promptyoself: invalid configuration: " + "; ".join(f"{n}: expected {accepts(n)}" for n in names)


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty working directory (no .env) and a private HOME."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_every_setting_has_a_case() -> None:
    assert set(CASES) == set(FIELDS), "add a bad and a good value for each new setting"


@pytest.mark.parametrize("env", sorted(CASES))
def test_good_value_loads_as_its_type(env: str, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _bad, good, want = CASES[env]
    monkeypatch.setenv(env, good)
    if env in PAIRED:
        monkeypatch.setenv(*PAIRED[env])
    got = read(env)
    if env == "PROMPTYOSELF_DB":
        got = load_settings().db_url
    if want == "HOME/logs/p.log":
        want = home / "logs" / "p.log"
    if callable(want):
        assert want(got), (env, got)
    else:
        assert got == want, (env, got)
    for kind, names in TYPES.items():
        if env in names:
            assert isinstance(got, kind), (env, type(got))


@pytest.mark.parametrize("env", sorted(set(CASES) - set(TARGET_VARS)))
def test_bad_value_stops_the_cli_with_exit_2_and_one_line(env: str, home: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from promptyoself.faces.cli import main

    bad = CASES[env][0]
    monkeypatch.setenv(env, bad)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.message == the_line(env)[len("promptyoself: "):]
    assert main(["list", "--agent-id", "agent-1"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [the_line(env)], err
    if len(bad) > 2 and bad not in accepts(env):
        assert bad not in err  # never echoed: it may be a secret set in the wrong variable


@pytest.mark.parametrize("env", TARGET_VARS)
def test_a_bad_target_setting_stops_that_target_only(env: str, home: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A target's own setting is read by its plug-in when the target is asked for: a bad one makes that
    target refuse, with the one line naming the variable (never the value); every entry point starts
    and the other commands work (issue 41 points 1 and 3)."""
    from promptyoself.faces.cli import main
    from promptyoself.targets import registry

    bad = CASES[env][0]
    monkeypatch.setenv(env, bad)
    load_settings()  # the core's settings load: nothing of the target's is read at start
    with pytest.raises(ConfigError) as info:
        read_plugin_settings(MODELS[env])
    assert info.value.message == the_line(env)[len("promptyoself: "):]
    target = TARGET_SETTINGS[MODELS[env]]
    assert registry.problems()[target] == f"its settings are invalid: {info.value.message}"
    assert main(["list", "--agent-id", "agent-1"]) == 0
    capsys.readouterr()
    code = main(["schedule", "--agent-id", "agent-1", "--prompt", "hi", "--time", "in 5m", "--target", target,
                 "--skip-validation"])
    out, err = capsys.readouterr()
    assert code != 0, (out, err)
    assert f"{env}: expected {accepts(env)}" in out + err, (out, err)
    if len(bad) > 2 and bad not in accepts(env):
        assert bad not in out + err


def test_several_bad_values_share_the_one_line(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTYOSELF_TIMEZONE", "Mars/Base")
    monkeypatch.setenv("PROMPTYOSELF_MISFIRE_GRACE", "bogus")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "\n" not in info.value.message
    assert "PROMPTYOSELF_TIMEZONE: expected" in info.value.message
    assert "PROMPTYOSELF_MISFIRE_GRACE: expected" in info.value.message


def test_the_env_file_is_named_when_one_is_read(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Path(".env").write_text("PROMPTYOSELF_MISFIRE_GRACE=bogus\n", encoding="utf-8")
    monkeypatch.delenv("PROMPTYOSELF_ENV_FILE")
    with pytest.raises(ConfigError, match=r"read from the environment or \.env\): PROMPTYOSELF_MISFIRE_GRACE"):
        load_settings()


def test_durations_print_as_written_in_messages() -> None:
    s = Settings(misfire_grace="24h", min_interval="90", health_max_lateness=timedelta(minutes=5))
    assert isinstance(s.misfire_grace, Interval) and f"{s.misfire_grace}" == "1d"
    assert f"{s.min_interval}" == "1m 30s" and s.min_interval == timedelta(seconds=90)
    assert s.health_max_lateness == timedelta(minutes=5)


def test_empty_values_mean_the_default(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for env in CASES:
        monkeypatch.setenv(env, "")
    assert load_settings() == Settings()
    for model in TARGET_SETTINGS:
        assert read_plugin_settings(model) == model()


# ---- docs and .env.example say exactly what the code accepts ------------------------------------


def test_docs_state_what_each_setting_accepts() -> None:
    rows = {}
    for line in CONFIG_DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| `([A-Z_]+)` \| (.*?) \| (.*?) \| (.*) \|$", line)
        if m and m.group(1) in FIELDS:
            rows[m.group(1)] = m.group(3)
    assert set(rows) == set(FIELDS)
    for env, cell in rows.items():
        assert cell == accepts(env), f"docs/configuration.md: the accepts cell of {env} should be {accepts(env)!r}"


def test_env_example_states_what_each_setting_accepts() -> None:
    lines = ENV_EXAMPLE.read_text(encoding="utf-8").splitlines()
    seen = set()
    for before, line in itertools.pairwise(lines):
        m = re.match(r"^([A-Z][A-Z0-9_]*)=", line)
        if m and m.group(1) in FIELDS:
            seen.add(m.group(1))
            assert before == f"# accepts: {accepts(m.group(1))}", f".env.example: the line above {m.group(1)}"
    assert seen == set(FIELDS)


# ---- every entry point, as a real process -------------------------------------------------------


def bad_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMPTYOSELF_", "LETTA_"))}
    env.update(PROMPTYOSELF_DB=str(tmp_path / "p.db"), PROMPTYOSELF_ENV_FILE=str(tmp_path / "absent.env"),
               LETTA_BASE_URL="http://127.0.0.1:9", PYTHONPATH=str(REPO),
               PROMPTYOSELF_MISFIRE_GRACE="bogus", **extra)
    return env


ENTRY_POINTS = {
    "stdio server script": [str(SERVER_SCRIPT)],
    "serve --transport stdio": ["-m", "promptyoself", "serve", "--transport", "stdio"],
    "serve (the HTTP service)": ["-m", "promptyoself", "serve", "--port", "0"],
    "a CLI command": ["-m", "promptyoself", "schedule", "--agent-id", "agent-1", "--prompt", "hi", "--time", "in 5m"],
    "the cli.py entry script": [str(REPO / "promptyoself" / "cli.py"), "list"],
    "worker": ["-m", "promptyoself", "worker"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_every_entry_point_exits_2_with_the_line(name: str, tmp_path: Path) -> None:
    proc = subprocess.run([PYTHON, *ENTRY_POINTS[name]], env=bad_env(tmp_path), cwd=tmp_path,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, (name, proc.returncode, proc.stderr)
    assert proc.stdout == "", name
    assert proc.stderr.splitlines() == [the_line("PROMPTYOSELF_MISFIRE_GRACE")], (name, proc.stderr)
    assert not (tmp_path / "p.db").exists(), "nothing should run before the settings are checked"


@pytest.mark.slow
def test_a_bad_timezone_stops_the_stdio_server(tmp_path: Path) -> None:
    env = bad_env(tmp_path, PROMPTYOSELF_TIMEZONE="Mars/Base")
    del env["PROMPTYOSELF_MISFIRE_GRACE"]
    proc = subprocess.run([PYTHON, str(SERVER_SCRIPT)], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.splitlines() == [the_line("PROMPTYOSELF_TIMEZONE")]


@pytest.mark.slow
def test_the_spawned_worker_fails_fast_and_logs_the_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The detached worker the server starts reads the same environment: with a bad value it exits at
    once and its log (its stderr) holds the line."""
    from promptyoself.delivery.starter import spawn, worker_log_path
    from promptyoself.processes import pid_alive

    settings = Settings(db=str(tmp_path / "w.db"), executor_autostart=False)
    monkeypatch.setenv("PROMPTYOSELF_MISFIRE_GRACE", "bogus")
    pid = spawn(settings, "spawn:test:1:abc")
    log = worker_log_path(settings)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and the_line("PROMPTYOSELF_MISFIRE_GRACE") not in _read(log):
        time.sleep(0.05)
    assert _read(log).splitlines() == [the_line("PROMPTYOSELF_MISFIRE_GRACE")]
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)
    assert not pid_alive(pid)
    assert not (tmp_path / "w.db").exists()


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
