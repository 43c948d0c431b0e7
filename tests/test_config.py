"""Configuration: every setting is in .env.example with its true default; .env and PROMPTYOSELF_ENV_FILE
are read; the database default is absolute and per user; paths and URLs both work."""

from __future__ import annotations

import re
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings

from promptyoself import config
from promptyoself.config import ConfigError, Settings, default_db_path, describe_settings_error, load_settings
from promptyoself.targets.claude_code.settings import ClaudeCodeSettings
from promptyoself.targets.codex.settings import CodexSettings
from promptyoself.targets.letta_code.settings import LettaCodeSettings
from tests.procs import REPO

ENV_EXAMPLE = REPO / ".env.example"
CONFIG_DOC = REPO / "docs" / "configuration.md"
EXTRA_DOCUMENTED = ("PROMPTYOSELF_ENV_FILE", "PROMPTYOSELF_TEST_PG_URL")
MODELS: tuple[type[BaseSettings], ...] = (Settings, LettaCodeSettings, ClaudeCodeSettings, CodexSettings)
"""The core's settings and the built-in targets' own (each read by its plug-in, from the same env file)."""


def setting_names() -> list[str]:
    """Every environment variable Settings and the built-in targets' settings read: the field aliases."""
    names = []
    for model in MODELS:
        for name, field in model.model_fields.items():
            alias = field.validation_alias
            assert isinstance(alias, str), f"{model.__name__}.{name} has no single env var alias"
            names.append(alias)
    assert len(names) == len(set(names)), "two settings classes read the same variable"
    return names


def example_assignments() -> dict[str, str]:
    """``NAME=value`` lines of .env.example (value without the trailing comment)."""
    out: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m:
            value = re.sub(r"\s+#.*$", "", " " + m.group(2)).strip()
            assert m.group(1) not in out, f"{m.group(1)} is listed twice"
            out[m.group(1)] = value
    return out


@pytest.fixture
def no_env_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Run in an empty directory without PROMPTYOSELF_ENV_FILE."""
    monkeypatch.delenv("PROMPTYOSELF_ENV_FILE", raising=False)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


# ---- .env.example ---------------------------------------------------------------------------------


def test_every_setting_is_in_env_example() -> None:
    listed = example_assignments()
    missing = [n for n in setting_names() if n not in listed]
    assert not missing, f".env.example lacks {missing}; add each with its default and a comment"
    unknown = [n for n in listed if n not in setting_names()]
    assert not unknown, f".env.example lists {unknown}, which no settings class reads"
    text = ENV_EXAMPLE.read_text(encoding="utf-8")
    for extra in EXTRA_DOCUMENTED:
        assert re.search(rf"^# {extra}=", text, re.M), f"{extra} should be mentioned (commented) in .env.example"


def test_every_example_line_has_a_comment() -> None:
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        if re.match(r"^[A-Z][A-Z0-9_]*=", line):
            assert re.search(r"\s#\s\S", line), f"no comment on: {line}"


@pytest.mark.parametrize("model", MODELS, ids=[m.__name__ for m in MODELS])
def test_env_example_defaults_are_the_real_defaults(no_env_file: Path, model: type[BaseSettings]) -> None:
    """Loading .env.example as the env file gives exactly the built-in defaults (the core's settings,
    and each built-in target's own, read by ``read_plugin_settings`` from the same file)."""
    defaults = model()
    from_example = model(_env_file=str(ENV_EXAMPLE))  # type: ignore[call-arg]
    for name in model.model_fields:
        got, want = getattr(from_example, name), getattr(defaults, name)
        if isinstance(got, SecretStr):
            got = got.get_secret_value() or None
        if got == "":
            got = None
        alias = model.model_fields[name].validation_alias
        assert got == want, f"{alias}: .env.example gives {got!r}, the default is {want!r}"
    if isinstance(from_example, Settings) and isinstance(defaults, Settings):
        assert from_example.db_url == defaults.db_url
        assert from_example.letta_token is None


def test_a_target_reads_its_settings_from_the_same_env_file(no_env_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    """The targets' own settings come from the environment over the ``.env`` file the core reads
    (``config.env_file``), re-read when either changes."""
    Path(".env").write_text("PROMPTYOSELF_CLAUDE_TIMEOUT=5m\nLETTA_CODE_URL=ws://127.0.0.1:4500\n", encoding="utf-8")
    assert config.read_plugin_settings(ClaudeCodeSettings).timeout == 300.0
    assert config.read_plugin_settings(LettaCodeSettings).letta_code_url == "ws://127.0.0.1:4500"
    monkeypatch.setenv("PROMPTYOSELF_CLAUDE_TIMEOUT", "90")  # the environment wins over the file
    assert config.read_plugin_settings(ClaudeCodeSettings).timeout == 90.0
    other = tmp_path / "other.env"
    other.write_text("PROMPTYOSELF_CODEX_ARGS=--sandbox workspace-write\n", encoding="utf-8")
    monkeypatch.setenv("PROMPTYOSELF_ENV_FILE", str(other))
    assert config.read_plugin_settings(CodexSettings).extra_args == ["--sandbox", "workspace-write"]
    assert config.read_plugin_settings(LettaCodeSettings).letta_code_url is None


def test_every_setting_is_documented() -> None:
    doc = CONFIG_DOC.read_text(encoding="utf-8")
    missing = [n for n in [*setting_names(), *EXTRA_DOCUMENTED] if f"`{n}`" not in doc]
    assert not missing, f"docs/configuration.md lacks {missing}"


# ---- where settings come from ---------------------------------------------------------------------


def test_defaults(no_env_file: Path) -> None:
    s = load_settings()
    assert s.letta_base_url == "http://localhost:8283"
    assert s.letta_token is None
    assert s.timezone == ZoneInfo("UTC")  # parsed when it loads
    assert s.executor_mode == "worker" and s.executor_enabled
    assert s.log_level == "INFO" and s.log_file is None and s.log_json is False
    assert s.log_max_bytes == 5_000_000 and s.log_backups == 3
    assert s.http_token is None
    assert s.max_active_per_agent == 100 and s.max_prompt_chars == 8000
    assert s.min_interval.total_seconds() == 10
    assert s.misfire_grace.total_seconds() == 24 * 3600


def test_dotenv_in_cwd_is_read(no_env_file: Path) -> None:
    (no_env_file / ".env").write_text(
        "LETTA_BASE_URL=http://letta.internal:9000\n"
        "PROMPTYOSELF_TIMEZONE=Europe/Berlin  # a comment\n"
        "promptyoself_log_level=debug\n"  # names are case-insensitive; values are normalized
        "PROMPTYOSELF_LOG_JSON=true\n"
        'LETTA_SERVER_PASSWORD="pw from dotenv"\n'
        "SOMETHING_ELSE=ignored\n"
    )
    assert config.env_file() == ".env"
    s = load_settings()
    assert s.letta_base_url == "http://letta.internal:9000"
    assert s.timezone == ZoneInfo("Europe/Berlin")
    assert s.log_level == "DEBUG"
    assert s.log_json is True
    assert s.letta_token == "pw from dotenv"


def test_environment_beats_dotenv(no_env_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (no_env_file / ".env").write_text("PROMPTYOSELF_TIMEZONE=Europe/Berlin\nPROMPTYOSELF_MAX_IN_FLIGHT=3\n")
    monkeypatch.setenv("PROMPTYOSELF_TIMEZONE", "Asia/Tokyo")
    s = load_settings()
    assert s.timezone == ZoneInfo("Asia/Tokyo")
    assert s.max_in_flight == 3


def test_env_file_variable_is_read(no_env_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (no_env_file / ".env").write_text("PROMPTYOSELF_TIMEZONE=Europe/Berlin\n")
    other = tmp_path / "elsewhere" / "promptyoself.env"
    other.parent.mkdir()
    other.write_text("PROMPTYOSELF_TIMEZONE=America/New_York\nPROMPTYOSELF_DEFAULT_AGENT_ID=agent-x\n")
    monkeypatch.setenv("PROMPTYOSELF_ENV_FILE", str(other))
    assert config.env_file() == str(other)
    s = load_settings()
    assert s.timezone == ZoneInfo("America/New_York")  # the named file, not ./.env
    assert s.default_agent_id == "agent-x"


def test_missing_env_file_is_not_an_error(no_env_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PROMPTYOSELF_ENV_FILE", str(tmp_path / "nope.env"))
    assert load_settings().timezone == ZoneInfo("UTC")


def test_overrides_win(no_env_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTYOSELF_EXECUTOR_INTERVAL", "7")
    assert load_settings(executor_interval=2.5).executor_interval == 2.5


def test_bad_values_are_named_without_echoing_them(no_env_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTYOSELF_MAX_IN_FLIGHT", "lots-secretish")
    monkeypatch.setenv("PROMPTYOSELF_LOG_LEVEL", "LOUD")
    with pytest.raises(ConfigError) as info:  # load_settings turns the ValidationError into one line
        load_settings()
    assert isinstance(info.value.__cause__, ValidationError)
    msg = describe_settings_error(info.value.__cause__)
    assert msg == info.value.message and "\n" not in msg
    assert "PROMPTYOSELF_MAX_IN_FLIGHT" in msg and "PROMPTYOSELF_LOG_LEVEL" in msg
    assert "lots-secretish" not in msg and "LOUD" not in msg


def test_bad_config_stops_the_server_cleanly(no_env_file: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from promptyoself.faces.serve import main

    monkeypatch.setenv("PROMPTYOSELF_EXECUTOR_MODE", "sometimes")
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "PROMPTYOSELF_EXECUTOR_MODE" in err and "Traceback" not in err


# ---- the database location ----------------------------------------------------------------------


def test_db_default_is_absolute_per_user_and_not_cwd(no_env_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from platformdirs import user_data_dir

    path = default_db_path()
    assert path.is_absolute()
    assert path == Path(user_data_dir("promptyoself", appauthor=False)) / "promptyoself.db"
    assert not str(path).startswith(str(no_env_file))
    url = load_settings().db_url
    assert url == f"sqlite:///{path}"
    # Same file whatever the working directory (Letta and Claude Desktop start us anywhere).
    monkeypatch.chdir("/")
    assert load_settings().db_url == url


def test_db_default_follows_home(no_env_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    path = default_db_path()
    assert str(path).startswith(str(tmp_path / "home"))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/var/lib/pys/p.db", "sqlite:////var/lib/pys/p.db"),
        ("sqlite:////var/lib/pys/p.db", "sqlite:////var/lib/pys/p.db"),
        ("sqlite:///:memory:", "sqlite:///:memory:"),
        ("postgresql+psycopg://u:p@db.example/pys", "postgresql+psycopg://u:p@db.example/pys"),
        ("  /spaced/around.db  ", "sqlite:////spaced/around.db"),
    ],
)
def test_db_path_or_url(raw: str, expected: str) -> None:
    assert Settings(db=raw).db_url == expected


def test_db_tilde_and_relative_paths_become_absolute(no_env_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert Settings(db="~/x/p.db").db_url == f"sqlite:///{tmp_path / 'h' / 'x' / 'p.db'}"
    assert Settings(db="rel.db").db_url == f"sqlite:///{no_env_file / 'rel.db'}"


def test_empty_values_mean_unset(no_env_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("PROMPTYOSELF_DB", "LETTA_API_KEY", "LETTA_SERVER_PASSWORD", "PROMPTYOSELF_HTTP_TOKEN",
                "PROMPTYOSELF_LOG_FILE", "PROMPTYOSELF_DEFAULT_AGENT_ID"):
        monkeypatch.setenv(var, "")
    s = load_settings()
    assert s.db_url == f"sqlite:///{default_db_path()}"
    assert s.letta_token is None
    from promptyoself.faces.http_auth import bearer_middleware

    assert bearer_middleware(s) == []


def test_api_key_wins_over_password() -> None:
    s = Settings(letta_api_key="key-1", letta_server_password="pw-2")
    assert s.letta_token == "key-1"
    assert Settings(letta_server_password=" pw-2 ").letta_token == "pw-2"


def test_repr_hides_secrets() -> None:
    s = Settings(letta_api_key="k-SECRET-1", letta_server_password="p-SECRET-2", http_token="t-SECRET-3",
                 db="postgresql+psycopg://u:d-SECRET-4@127.0.0.1:1/x")
    text = repr(s) + str(s)
    for secret in ("k-SECRET-1", "p-SECRET-2", "t-SECRET-3", "d-SECRET-4"):
        assert secret not in text
