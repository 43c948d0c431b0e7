"""One Settings object, read from the environment and a ``.env`` file.

The ``.env`` file is the one in the working directory, or the file named by
``PROMPTYOSELF_ENV_FILE``. Every setting is listed with its default in ``.env.example``.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def redact_url(url: str) -> str:
    """A URL with any ``user:password@`` part removed: safe for messages, results and logs."""
    return re.sub(r"//[^/@]*@", "//", url)


def default_db_path() -> Path:
    """The per-user data file, never the working directory (Letta and Claude Desktop start us anywhere)."""
    from platformdirs import user_data_dir

    return Path(user_data_dir("promptyoself", appauthor=False)) / "promptyoself.db"


class Settings(BaseSettings):
    """Every knob PromptYoSelf reads. Field aliases are the environment variable names."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True, case_sensitive=False)

    letta_base_url: str = Field("http://localhost:8283", validation_alias="LETTA_BASE_URL")
    letta_api_key: SecretStr | None = Field(None, validation_alias="LETTA_API_KEY")
    letta_server_password: SecretStr | None = Field(None, validation_alias="LETTA_SERVER_PASSWORD")
    letta_timeout: float = Field(10.0, gt=0, validation_alias="PROMPTYOSELF_LETTA_TIMEOUT")

    # repr=False: a database URL may hold a password; keep it out of any repr of the settings.
    db: str | None = Field(None, validation_alias="PROMPTYOSELF_DB", repr=False)
    timezone: str = Field("UTC", validation_alias="PROMPTYOSELF_TIMEZONE")

    executor_mode: Literal["worker", "embedded", "off"] = Field("worker", validation_alias="PROMPTYOSELF_EXECUTOR_MODE")
    executor_autostart: bool = Field(True, validation_alias="PROMPTYOSELF_EXECUTOR_AUTOSTART")
    executor_interval: float = Field(1.0, gt=0, validation_alias="PROMPTYOSELF_EXECUTOR_INTERVAL")
    worker_idle_exit: float = Field(600.0, ge=0, validation_alias="PROMPTYOSELF_WORKER_IDLE_EXIT")
    lease_seconds: float = Field(60.0, gt=0, validation_alias="PROMPTYOSELF_LEASE_SECONDS")
    max_in_flight: int = Field(8, ge=1, validation_alias="PROMPTYOSELF_MAX_IN_FLIGHT")
    max_attempts: int = Field(10, ge=1, validation_alias="PROMPTYOSELF_MAX_ATTEMPTS")
    retry_base: float = Field(5.0, gt=0, validation_alias="PROMPTYOSELF_RETRY_BASE")
    retry_max: float = Field(600.0, gt=0, validation_alias="PROMPTYOSELF_RETRY_MAX")
    misfire_grace: str = Field("24h", validation_alias="PROMPTYOSELF_MISFIRE_GRACE")
    message_format: Literal["annotated", "plain"] = Field("annotated", validation_alias="PROMPTYOSELF_MESSAGE_FORMAT")

    default_agent_id: str | None = Field(None, validation_alias="PROMPTYOSELF_DEFAULT_AGENT_ID")
    letta_agent_id: str | None = Field(None, validation_alias="LETTA_AGENT_ID")
    letta_default_agent_id: str | None = Field(None, validation_alias="LETTA_DEFAULT_AGENT_ID")
    use_single_agent_fallback: bool = Field(False, validation_alias="PROMPTYOSELF_USE_SINGLE_AGENT_FALLBACK")

    max_active_per_agent: int = Field(100, ge=1, validation_alias="PROMPTYOSELF_MAX_ACTIVE_PER_AGENT")
    min_interval: str = Field("10s", validation_alias="PROMPTYOSELF_MIN_INTERVAL")
    max_prompt_chars: int = Field(8000, ge=1, validation_alias="PROMPTYOSELF_MAX_PROMPT_CHARS")

    log_level: str = Field("INFO", validation_alias="PROMPTYOSELF_LOG_LEVEL")
    log_file: str | None = Field(None, validation_alias="PROMPTYOSELF_LOG_FILE")
    log_json: bool = Field(False, validation_alias="PROMPTYOSELF_LOG_JSON")
    log_max_bytes: int = Field(5_000_000, ge=1024, validation_alias="PROMPTYOSELF_LOG_MAX_BYTES")
    log_backups: int = Field(3, ge=1, le=100, validation_alias="PROMPTYOSELF_LOG_BACKUPS")

    http_token: SecretStr | None = Field(None, validation_alias="PROMPTYOSELF_HTTP_TOKEN")
    letta_proxy: bool = Field(False, validation_alias="PROMPTYOSELF_LETTA_PROXY")

    health_max_lateness: str = Field("5m", validation_alias="PROMPTYOSELF_HEALTH_MAX_LATENESS")
    health_letta_cache: float = Field(30.0, ge=0, validation_alias="PROMPTYOSELF_HEALTH_LETTA_CACHE")

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: object) -> object:
        if isinstance(value, str):
            upper = value.strip().upper()
            if upper not in LOG_LEVELS:
                raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
            return upper
        return value

    @cached_property
    def db_url(self) -> str:
        """The SQLAlchemy URL: ``PROMPTYOSELF_DB`` as a URL, a file path, or the per-user default."""
        raw = (self.db or "").strip()
        if "://" in raw:
            return raw
        path = Path(raw).expanduser() if raw else default_db_path()
        return f"sqlite:///{path.resolve()}"

    @property
    def letta_token(self) -> str | None:
        """The bearer credential for Letta: the API key, else the server password, else nothing."""
        for secret in (self.letta_api_key, self.letta_server_password):
            if secret is not None and secret.get_secret_value().strip():
                return secret.get_secret_value().strip()
        return None

    @property
    def misfire_grace_td(self) -> timedelta:
        from promptyoself.timing import parse_interval

        return parse_interval(self.misfire_grace)

    @property
    def min_interval_td(self) -> timedelta:
        from promptyoself.timing import parse_interval

        return parse_interval(self.min_interval)

    @property
    def health_max_lateness_td(self) -> timedelta:
        from promptyoself.timing import parse_interval

        return parse_interval(self.health_max_lateness)

    @property
    def executor_enabled(self) -> bool:
        return self.executor_autostart and self.executor_mode != "off"

    # The service's Unix socket for stdio servers of the same database (promptyoself/faces/relay.py).
    stdio_relay: Literal["auto", "off"] = Field("auto", validation_alias="PROMPTYOSELF_STDIO_RELAY")


def env_file() -> str | None:
    """``PROMPTYOSELF_ENV_FILE`` if set, else ``.env`` in the working directory when it exists."""
    explicit = os.environ.get("PROMPTYOSELF_ENV_FILE")
    if explicit:
        return explicit
    return ".env" if Path(".env").is_file() else None


def load_settings(**overrides: object) -> Settings:
    """Read settings from env and ``.env``; keyword overrides win (used by tests and CLI flags)."""
    return Settings(_env_file=env_file(), **overrides)  # type: ignore[call-arg]


def describe_settings_error(exc: ValidationError) -> str:
    """A one-paragraph message naming each bad variable, without echoing its value (it may be a secret)."""
    aliases = {name: str(field.validation_alias or name).upper() for name, field in Settings.model_fields.items()}
    parts = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = err.get("loc") or ("?",)
        name = str(loc[0])
        parts.append(f"{aliases.get(name, name)}: {err.get('msg', 'invalid value')}")
    where = env_file()
    source = f" (environment or {where})" if where else " (environment)"
    return "Invalid configuration" + source + ": " + "; ".join(parts)
