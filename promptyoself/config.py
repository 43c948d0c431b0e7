"""One Settings object, read from the environment and a ``.env`` file, every value parsed into its
type when it loads (durations, the time zone, choices, URLs, paths, booleans, numbers).

The ``.env`` file is the one in the working directory, or the file named by
``PROMPTYOSELF_ENV_FILE``. Every setting is listed with its default in ``.env.example``. A bad value
makes :func:`load_settings` raise :class:`ConfigError`, whose one line each entry point prints on
stderr before exiting with code 2 (docs/configuration.md).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from datetime import datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from zoneinfo import ZoneInfo

from pydantic import BeforeValidator, Field, PlainValidator, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from promptyoself import timing
from promptyoself.errors import PromptYoSelfError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DB_SCHEMES = ("sqlite", "sqlite+pysqlite", "postgresql", "postgresql+psycopg", "postgresql+psycopg2")
"""The SQLAlchemy URL schemes ``PROMPTYOSELF_DB`` may use (the backends and drivers the store supports)."""
MAX_AGENT_ID_CHARS = 100
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_AGENT_ID = re.compile(r"[\x21-\x7e]+")
_WHSEC = re.compile(r"whsec_[A-Za-z0-9+/]+={0,2}")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")

# What each kind of setting accepts, word for word as docs/configuration.md states it (a test checks).
ACCEPTS_INTERVAL = "a duration of at least 1s such as 30s, 10m, 1h30m, 24h, 1d or PT2H, or whole seconds such as 90"
ACCEPTS_SECONDS = "a number of seconds > 0 such as 2.5, or a duration such as 30s or 10m"
ACCEPTS_SECONDS_OR_0 = "a number of seconds >= 0 such as 2.5 (0 = {zero}), or a duration such as 30s or 10m"
ACCEPTS_BOOL = "true or false (also 1/0, yes/no, on/off, t/f, y/n, any case)"
ACCEPTS_COUNT = "a whole number >= 1"
ACCEPTS_COUNT_OR_0 = "a whole number >= 0 (0 = no limit)"
ACCEPTS_INTERVAL_OR_OFF = ACCEPTS_INTERVAL + ", or off (empty = off)"
ACCEPTS_SECRET = "any text without control characters (empty = unset)"
ACCEPTS_TARGET_SLOTS = ("target=count pairs separated by commas, each count a whole number >= 1, such as "
                        "NAME=2,OTHER=4 (empty = PROMPTYOSELF_MAX_IN_FLIGHT for every target)")
_TARGET_SLOT = re.compile(r"([a-z0-9][a-z0-9_.-]{0,15})=([1-9][0-9]{0,5})")
ACCEPTS_AGENT_ID = (f"an agent id: up to {MAX_AGENT_ID_CHARS} printable characters without spaces, "
                    "e.g. agent-UUID (empty = unset)")


class ConfigError(ValueError):
    """A setting has a value its variable does not accept. ``message`` is one line naming the
    variable(s) and what each accepts, never the value (it may be a secret in the wrong place)."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def report(self) -> int:
        """Write ``promptyoself: <message>`` to stderr (never stdout) and return the exit code, 2."""
        sys.stderr.write(f"promptyoself: {self.message}\n")
        sys.stderr.flush()
        return self.exit_code


REDACTED = "***"
# ``scheme://user:password@``: the password runs to the first ``@`` (as SQLAlchemy's ``make_url``
# reads it), so a password with an unescaped ``/``, ``?`` or ``#`` is still found whole.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@?#]*):(?P<password>[^\s@]*)@")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
# Query parameters whose value is a credential (``?password=``, ``?token=``, ``?api_key=`` ...).
_SECRET_PARAM = re.compile(r"(?P<key>[?&;][^=&;#\s]*(?:pass|pwd|token|secret|key|auth|signature|credential)"
                           r"[^=&;#\s]*=)[^&;#\s]*", re.IGNORECASE)


def url_secrets(url: str | None) -> list[str]:
    """The credentials a URL holds, percent-decoded: the password of its ``user:password@`` part and
    the values of its credential query parameters (what ``redact_url`` hides), for the log filter."""
    from urllib.parse import unquote

    if not url or "://" not in url:
        return []
    url = url.strip()
    found = _USERINFO.match(url)
    secrets = [found.group("password")] if found else []
    rest = url[found.end():] if found else url
    if "?" in rest:
        query = "?" + rest.split("?", 1)[1]
        secrets.extend(m.group(0)[len(m.group("key")):] for m in _SECRET_PARAM.finditer(query))
    return [unquote(s) for s in secrets if s]


def redact_url(text: str) -> str:
    """``text`` (one URL, or a message holding URLs) with every URL's password, and the value of
    every credential-looking query parameter, shown as ``***``; the user, host, path and the rest are
    kept. Text without a URL (a file path) comes back as it is. The one URL redaction of the package:
    messages, results, health, the start-up log line and ``service install --print`` use it."""

    def one(match: re.Match[str]) -> str:
        url = _USERINFO.sub(lambda m: f"{m.group('head')}:{REDACTED}@", match.group(0), count=1)
        if "?" in url:
            head, query = url.split("?", 1)
            url = head + _SECRET_PARAM.sub(lambda m: m.group("key") + REDACTED, "?" + query)
        return url

    return _URL.sub(one, text)


def redact_endpoint(url: str) -> str:
    """A URL whose path and query may themselves be the credential (an endpoint's: Slack's
    ``/services/T.../B.../<secret>``, a ``?token=`` of any name): ``scheme://host:port`` and, when
    there was more, ``/***``. The user and password go too. For every place such a URL is shown: error
    messages and history, health and readiness lines, logs (issue 42 item 7)."""
    from urllib.parse import urlsplit

    text = url.strip()
    try:
        parts = urlsplit(text)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return REDACTED
    if not parts.scheme or not host:
        return REDACTED
    shown_host = f"[{host}]" if ":" in host else host
    head = f"{parts.scheme}://{shown_host}" + (f":{port}" if port is not None else "")
    more = parts.path.strip("/") or parts.query or parts.fragment
    return head + (f"/{REDACTED}" if more else "")


def endpoint_secrets(url: str) -> list[str]:
    """The part of an endpoint's URL that ``redact_endpoint`` hides (its path and query), for the
    log filter and the history's redaction, when it is long enough to be a credential rather than a
    word that other text holds too (``/in``, ``/hook``)."""
    from urllib.parse import unquote, urlsplit

    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return []
    hidden = parts.path.strip("/") + (f"?{parts.query}" if parts.query else "")
    found = [hidden, parts.path.rstrip("/"), parts.query, unquote(hidden)]
    return [s for s in dict.fromkeys(found) if len(s) >= 12]


_HOST_NAME = re.compile(r"\*|\[[0-9a-f:.]+\]|[a-z0-9_.:-]{1,253}")


_BEARER = re.compile(r"(?i)\b(bearer\s+)(?!\*\*\*)([A-Za-z0-9._~+/=-]{4,})")
_CREDENTIAL_FIELD = re.compile(
    r"(?i)\b(password|passwd|token|api[_-]?key|authorization|x-bare-password)([\"']?\s*[:=]\s*[\"']?)"
    r"(?!\*\*\*)([^\s\"',;}]{4,})")
_FIELD_WORDS = ("pass", "token", "api", "authorization")
"""What every name ``_CREDENTIAL_FIELD`` matches contains, lowered: a text with none has no such field."""


def redact_credentials(text: str) -> str:
    """``text`` with credentials that travel in headers or fields replaced by ``***``: ``Bearer <x>``
    and ``password: <x>`` / ``"token": "<x>"`` / ``api_key=<x>`` (a server that echoes our request)."""
    if text.isascii():  # ASCII: a pattern that ignores case cannot match where its word is not (lowered)
        low = text.lower()
        bearer, field = "bearer" in low, any(word in low for word in _FIELD_WORDS)
    else:  # elsewhere case folding has surprises (the Kelvin sign matches "k"): the patterns decide
        bearer = field = True
    if bearer:
        text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    if field:
        text = _CREDENTIAL_FIELD.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    return text


def default_db_path() -> Path:
    """The per-user data file, never the working directory (Letta and Claude Desktop start us anywhere)."""
    from platformdirs import user_data_dir

    return Path(user_data_dir("promptyoself", appauthor=False)) / "promptyoself.db"


# ---- a plug-in's own settings ------------------------------------------------------------------------


class PluginSettings(BaseSettings):
    """The base of a plug-in's own settings class (a delivery target's, docs/plugins.md): its fields are
    declared with ``setting`` as ``Settings`` declares its own, and it is read by ``read_plugin_settings``
    from the same environment and ``.env`` file, when the plug-in is first asked for (not at start)."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True, case_sensitive=False,
                                      env_ignore_empty=True)


# ---- value parsers: each turns the raw text into its type or raises ValueError -------------------


class Interval(timedelta):
    """A parsed duration setting: a ``timedelta`` that prints compactly (``10s``, ``1d``, ``1h 30m``),
    so messages quoting a setting read as the user wrote it."""

    def __str__(self) -> str:
        return timing.format_duration(self)


def _interval(value: object) -> Interval:
    if isinstance(value, timedelta):
        if value < timedelta(seconds=1):
            raise ValueError("under 1 second")
        return Interval(microseconds=value // timedelta(microseconds=1))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("not a duration")
    try:
        td = timing.parse_interval(value)
    except PromptYoSelfError as exc:
        raise ValueError(exc.message) from None
    return Interval(microseconds=td // timedelta(microseconds=1))


def _seconds(value: object) -> object:
    """Plain seconds (``2.5``) stay a number for the float check; duration text becomes seconds."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str) and value.strip() and not _NUMBER.fullmatch(value.strip()):
        try:
            return timing.parse_interval(value).total_seconds()
        except PromptYoSelfError as exc:
            raise ValueError(exc.message) from None
    return value


def _zone(value: object) -> ZoneInfo:
    if isinstance(value, ZoneInfo):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError("not a time zone name")
    try:
        return timing.resolve_zone(value)
    except PromptYoSelfError as exc:
        raise ValueError(exc.message) from None


def _lower(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


def _interval_or_off(value: object) -> Interval | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "off", "none")):
        return None
    return _interval(value)


def parse_duration_or_off(value: object) -> Interval | None:
    """A duration setting's value (``10m``, ``1h30m``, ``90``) or ``None`` for ``off`` / empty;
    ``ValueError`` otherwise (the policy table's ``approval_below`` is read with it)."""
    return _interval_or_off(value)


Seconds = Annotated[float, BeforeValidator(_seconds)]
Duration = Annotated[Interval, PlainValidator(_interval)]
DurationOrOff = Annotated[Interval | None, PlainValidator(_interval_or_off)]
Zone = Annotated[ZoneInfo, PlainValidator(_zone)]


def _field(default: Any, env: str, accepts: str, **constraints: Any) -> Any:
    """A setting read from ``env``; ``accepts`` (kept as the field's description) is what the error
    line and docs/configuration.md say it takes."""
    return Field(default, validation_alias=env, description=accepts, **constraints)


def setting(default: Any, env: str, accepts: str, **constraints: Any) -> Any:
    """A setting of a plug-in's own settings class (``PluginSettings``), as ``Settings`` declares its
    own: read from ``env``; ``accepts`` is what the error line and the docs say it takes."""
    return _field(default, env, accepts, **constraints)


def parse_command(value: object) -> object:
    """A setting naming an executable (a path, or a command looked up in PATH): stripped, None for
    empty; ``ValueError`` for control characters. For a plug-in's ``field_validator``."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if _CONTROL.search(text):
        raise ValueError("not a path")
    return text or None


def parse_shell_args(value: object) -> object:
    """A setting of extra command-line arguments as a shell would split them: stripped, None for empty;
    ``ValueError`` for control characters or unbalanced quotes. For a plug-in's ``field_validator``."""
    if not isinstance(value, str):
        return value
    import shlex

    text = value.strip()
    if _CONTROL.search(text):
        raise ValueError("control characters")
    shlex.split(text)  # unbalanced quotes: ValueError
    return text or None


def is_signing_secret(text: str) -> bool:
    """A Standard Webhooks signing secret: ``whsec_`` and base64, at most 200 characters (the alert
    secret's form, and a signing target's)."""
    return bool(_WHSEC.fullmatch(text)) and len(text) <= 200


def is_url(text: str, schemes: str) -> bool:
    """``scheme://host...`` with one of ``schemes`` (a regex), a host, and no control character."""
    m = re.fullmatch(rf"(?i)({schemes})://([^/?#\s]+)(\S*)", text)
    if m is None or _CONTROL.search(text):
        return False
    return bool(m.group(2).rpartition("@")[2].strip(":"))


class Settings(BaseSettings):
    """Every knob PromptYoSelf reads, each parsed into its type when it loads. Field aliases are the
    environment variable names; each field's description is what the variable accepts."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True, case_sensitive=False,
                                      env_ignore_empty=True)

    letta_base_url: str = _field("http://localhost:8283", "LETTA_BASE_URL", "an http:// or https:// URL with a host")
    letta_api_key: SecretStr | None = _field(None, "LETTA_API_KEY", ACCEPTS_SECRET)
    letta_server_password: SecretStr | None = _field(None, "LETTA_SERVER_PASSWORD", ACCEPTS_SECRET)
    letta_timeout: Seconds = _field(10.0, "PROMPTYOSELF_LETTA_TIMEOUT", ACCEPTS_SECONDS, gt=0, allow_inf_nan=False)
    # repr=False: a database URL may hold a password; keep it out of any repr of the settings.
    db: str | None = Field(
        None, validation_alias="PROMPTYOSELF_DB", repr=False,
        description="a file path, or a URL whose scheme is " + ", ".join(f"{s}://" for s in DB_SCHEMES)
        + " (empty = the per-user default file)",
    )
    timezone: Zone = _field(
        ZoneInfo("UTC"), "PROMPTYOSELF_TIMEZONE",
        "an IANA time zone name such as UTC or Europe/Berlin (Z and GMT, in any case, also mean UTC)")

    executor_mode: Literal["worker", "embedded", "off"] = _field(
        "worker", "PROMPTYOSELF_EXECUTOR_MODE", "worker, embedded or off (any case)")
    executor_autostart: bool = _field(True, "PROMPTYOSELF_EXECUTOR_AUTOSTART", ACCEPTS_BOOL)
    executor_interval: Seconds = _field(1.0, "PROMPTYOSELF_EXECUTOR_INTERVAL", ACCEPTS_SECONDS,
                                        gt=0, allow_inf_nan=False)
    worker_idle_exit: Seconds = _field(600.0, "PROMPTYOSELF_WORKER_IDLE_EXIT",
                                       ACCEPTS_SECONDS_OR_0.format(zero="never"), ge=0, allow_inf_nan=False)
    lease_seconds: Seconds = _field(60.0, "PROMPTYOSELF_LEASE_SECONDS", ACCEPTS_SECONDS, gt=0, allow_inf_nan=False)
    max_in_flight: int = _field(32, "PROMPTYOSELF_MAX_IN_FLIGHT", ACCEPTS_COUNT, ge=1)
    target_slots: str | None = _field(None, "PROMPTYOSELF_TARGET_IN_FLIGHT", ACCEPTS_TARGET_SLOTS)
    max_attempts: int | None = _field(None, "PROMPTYOSELF_MAX_ATTEMPTS",
                                      "a whole number >= 1 (empty = no count: retry until "
                                      "PROMPTYOSELF_MISFIRE_GRACE has passed)", ge=1)
    retry_base: Seconds = _field(5.0, "PROMPTYOSELF_RETRY_BASE", ACCEPTS_SECONDS, gt=0, allow_inf_nan=False)
    retry_max: Seconds = _field(600.0, "PROMPTYOSELF_RETRY_MAX", ACCEPTS_SECONDS, gt=0, allow_inf_nan=False)
    retry_after_max: Seconds = _field(600.0, "PROMPTYOSELF_RETRY_AFTER_MAX", ACCEPTS_SECONDS, gt=0,
                                      allow_inf_nan=False)
    misfire_grace: Duration = _field("24h", "PROMPTYOSELF_MISFIRE_GRACE", ACCEPTS_INTERVAL, validate_default=True)
    overlap_poll: Seconds = _field(5.0, "PROMPTYOSELF_OVERLAP_POLL", ACCEPTS_SECONDS, gt=0, allow_inf_nan=False)
    message_format: Literal["annotated", "plain"] = _field(
        "annotated", "PROMPTYOSELF_MESSAGE_FORMAT", "annotated or plain (any case)")

    default_agent_id: str | None = _field(None, "PROMPTYOSELF_DEFAULT_AGENT_ID", ACCEPTS_AGENT_ID)
    letta_agent_id: str | None = _field(None, "LETTA_AGENT_ID", ACCEPTS_AGENT_ID)
    letta_default_agent_id: str | None = _field(None, "LETTA_DEFAULT_AGENT_ID", ACCEPTS_AGENT_ID)
    use_single_agent_fallback: bool = _field(False, "PROMPTYOSELF_USE_SINGLE_AGENT_FALLBACK", ACCEPTS_BOOL)

    max_active_per_agent: int = _field(100, "PROMPTYOSELF_MAX_ACTIVE_PER_AGENT", ACCEPTS_COUNT, ge=1)
    min_interval: Duration = _field("10s", "PROMPTYOSELF_MIN_INTERVAL", ACCEPTS_INTERVAL, validate_default=True)
    max_prompt_chars: int = _field(8000, "PROMPTYOSELF_MAX_PROMPT_CHARS", ACCEPTS_COUNT, ge=1)
    max_payload_bytes: int = _field(256 * 1024, "PROMPTYOSELF_MAX_PAYLOAD_BYTES", "a whole number >= 1024", ge=1024)
    # Retention (promptyoself purge, and the service once an hour): ended schedules and old history go.
    keep_ended: DurationOrOff = _field("7d", "PROMPTYOSELF_KEEP_ENDED", ACCEPTS_INTERVAL_OR_OFF,
                                       validate_default=True)
    keep_history: DurationOrOff = _field("30d", "PROMPTYOSELF_KEEP_HISTORY", ACCEPTS_INTERVAL_OR_OFF,
                                         validate_default=True)

    # Guardrails against a runaway agent (docs/console.md): each delivered prompt costs an LLM turn.
    max_deliveries_per_agent_per_day: int = _field(500, "PROMPTYOSELF_MAX_DELIVERIES_PER_AGENT_PER_DAY",
                                                   ACCEPTS_COUNT_OR_0, ge=0)
    max_schedules_per_agent_per_hour: int = _field(60, "PROMPTYOSELF_MAX_SCHEDULES_PER_AGENT_PER_HOUR",
                                                   ACCEPTS_COUNT_OR_0, ge=0)
    approval_below: DurationOrOff = _field(None, "PROMPTYOSELF_APPROVAL_BELOW", ACCEPTS_INTERVAL_OR_OFF)
    # Cost budgets (docs/console.md, "Cost budgets"): what the agent's receipts reported today.
    max_tokens_per_agent_per_day: int = _field(0, "PROMPTYOSELF_MAX_TOKENS_PER_AGENT_PER_DAY",
                                               "a whole number >= 0 (0 = no token budget)", ge=0, le=10**12)
    max_cost_usd_per_agent_per_day: float = _field(0.0, "PROMPTYOSELF_MAX_COST_USD_PER_AGENT_PER_DAY",
                                                   "a number of US dollars >= 0 such as 2.50 (0 = no cost budget)",
                                                   ge=0, le=1_000_000, allow_inf_nan=False)
    # Failure alerts (docs/console.md, "Alerts"): the policy's seed, and where alerts are POSTed.
    pause_after_failures: int = _field(5, "PROMPTYOSELF_PAUSE_AFTER_FAILURES",
                                       "a whole number >= 0 (0 = never pause for failures)", ge=0)
    alert_url: str | None = _field(None, "PROMPTYOSELF_ALERT_URL",
                                   "an http:// or https:// URL with a host that receives signed alert POSTs "
                                   "(empty = alerts only in the console and /metrics)")
    alert_secret: SecretStr | None = _field(None, "PROMPTYOSELF_ALERT_SECRET",
                                            "whsec_ followed by base64 (the alert endpoint's signing secret; "
                                            "needed with PROMPTYOSELF_ALERT_URL)")
    approval_ask_timeout: Seconds = _field(60.0, "PROMPTYOSELF_APPROVAL_ASK_TIMEOUT",
                                           ACCEPTS_SECONDS_OR_0.format(zero="never ask in the client"),
                                           ge=0, allow_inf_nan=False)

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = _field(
        "INFO", "PROMPTYOSELF_LOG_LEVEL", ", ".join(LOG_LEVELS[:-1]) + f" or {LOG_LEVELS[-1]} (any case)")
    log_file: Path | None = _field(None, "PROMPTYOSELF_LOG_FILE",
                                   "a file path (~ expanded) without control characters, not ending in / "
                                   "(empty = stderr only)")
    log_json: bool = _field(False, "PROMPTYOSELF_LOG_JSON", ACCEPTS_BOOL)
    log_max_bytes: int = _field(5_000_000, "PROMPTYOSELF_LOG_MAX_BYTES", "a whole number >= 1024", ge=1024)
    log_backups: int = _field(3, "PROMPTYOSELF_LOG_BACKUPS", "a whole number from 1 to 100", ge=1, le=100)

    http_token: SecretStr | None = _field(None, "PROMPTYOSELF_HTTP_TOKEN", ACCEPTS_SECRET)
    agent_token: SecretStr | None = _field(None, "PROMPTYOSELF_AGENT_TOKEN", ACCEPTS_SECRET)
    letta_proxy: bool = _field(False, "PROMPTYOSELF_LETTA_PROXY", ACCEPTS_BOOL)
    allowed_hosts: str | None = _field(None, "PROMPTYOSELF_ALLOWED_HOSTS",
                                "host names separated by commas, or * for any (empty = loopback names only)")
    trusted_proxies: str | None = _field(
        None, "PROMPTYOSELF_TRUSTED_PROXIES",
        "IP addresses or networks (CIDR) of reverse proxies, separated by commas (empty = none: the "
        "peer address is the client)")
    max_request_bytes: int = _field(4 * 1024 * 1024, "PROMPTYOSELF_MAX_REQUEST_BYTES", "a whole number >= 1024",
                                    ge=1024)
    mcp_session_idle: Seconds = _field(600.0, "PROMPTYOSELF_MCP_SESSION_IDLE", ACCEPTS_SECONDS,
                                       gt=0, allow_inf_nan=False)
    mcp_max_sessions: int = _field(1000, "PROMPTYOSELF_MCP_MAX_SESSIONS", ACCEPTS_COUNT, ge=1)
    http_header_timeout: Seconds = _field(10.0, "PROMPTYOSELF_HTTP_HEADER_TIMEOUT", ACCEPTS_SECONDS,
                                          gt=0, allow_inf_nan=False)
    http_max_connections: int = _field(1000, "PROMPTYOSELF_HTTP_MAX_CONNECTIONS", "a whole number >= 16", ge=16)

    health_max_lateness: Duration = _field("5m", "PROMPTYOSELF_HEALTH_MAX_LATENESS", ACCEPTS_INTERVAL,
                                           validate_default=True)
    health_letta_cache: Seconds = _field(30.0, "PROMPTYOSELF_HEALTH_LETTA_CACHE",
                                         ACCEPTS_SECONDS_OR_0.format(zero="probe on every call"),
                                         ge=0, allow_inf_nan=False)

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("executor_mode", "message_format", "stdio_relay", mode="before")
    @classmethod
    def _enum(cls, value: object) -> object:
        return _lower(value)

    @field_validator("letta_base_url", mode="before")
    @classmethod
    def _letta_url(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if not is_url(text, "https?"):
                raise ValueError("not an http(s) URL")
            return text
        return value

    @field_validator("db", mode="before")
    @classmethod
    def _db(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if _CONTROL.search(text):
            raise ValueError("control characters")
        if "://" in text and text.split("://", 1)[0].lower() not in DB_SCHEMES:
            raise ValueError("unknown database URL scheme")
        return text or None

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _hosts(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        names = [n.strip().lower() for n in value.split(",") if n.strip()]
        if any(not _HOST_NAME.fullmatch(n) for n in names) or ("*" in names and len(names) > 1):
            raise ValueError("not host names")
        return ",".join(names) or None

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _proxies(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        import ipaddress

        names = [n.strip() for n in value.split(",") if n.strip()]
        for name in names:
            ipaddress.ip_network(name, strict=False)  # ValueError: not an address or a network
        return ",".join(names) or None

    @property
    def allowed_host_names(self) -> frozenset[str] | None:
        """``PROMPTYOSELF_ALLOWED_HOSTS`` as names (lower case, no port), or None for ``*`` (any host)."""
        names = frozenset(n for n in (self.allowed_hosts or "").split(",") if n)
        return None if "*" in names else names

    @field_validator("letta_api_key", "letta_server_password", "http_token", "agent_token", mode="before")
    @classmethod
    def _secret(cls, value: object) -> object:
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(text, str) and _CONTROL.search(text.strip()):
            raise ValueError("control characters")
        return value

    @field_validator("alert_url", mode="before")
    @classmethod
    def _alert_url(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text and (not is_url(text, "https?") or len(text) > 2000):
                raise ValueError("not an http(s) URL")
            return text or None
        return value

    @field_validator("alert_secret", mode="before")
    @classmethod
    def _alert_secret(cls, value: object) -> object:
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(text, str):
            text = text.strip()
            if text and not is_signing_secret(text):
                raise ValueError("not a whsec_ secret")
            return text or None
        return value

    @property
    def alert_endpoint(self) -> tuple[str, str] | None:
        """``(url, secret)`` of the alert endpoint when both are set, else None."""
        if self.alert_url and self.alert_secret is not None:
            return self.alert_url, self.alert_secret.get_secret_value()
        return None

    @field_validator("target_slots", mode="before")
    @classmethod
    def _target_slots(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        pairs = [p.strip().lower().replace(" ", "") for p in value.split(",") if p.strip()]
        if any(not _TARGET_SLOT.fullmatch(p) for p in pairs):
            raise ValueError("not target=count pairs")
        return ",".join(pairs) or None

    @property
    def target_in_flight(self) -> dict[str, int]:
        """``PROMPTYOSELF_TARGET_IN_FLIGHT``: each named target's own send slots (the others have
        ``PROMPTYOSELF_MAX_IN_FLIGHT`` each)."""
        out: dict[str, int] = {}
        for pair in (self.target_slots or "").split(","):
            if pair:
                name, _, count = pair.partition("=")
                out[name] = int(count)
        return out

    @field_validator("default_agent_id", "letta_agent_id", "letta_default_agent_id", mode="before")
    @classmethod
    def _agent_id(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text and (len(text) > MAX_AGENT_ID_CHARS or not _AGENT_ID.fullmatch(text)):
            raise ValueError("not an agent id")
        return text or None

    @field_validator("log_file", mode="before")
    @classmethod
    def _log_file(cls, value: object) -> object:
        if isinstance(value, Path):
            value = str(value)
        if not isinstance(value, str):
            return value
        text = value.strip()
        if _CONTROL.search(text) or text.endswith(("/", os.sep)):
            raise ValueError("not a file path")
        return Path(text).expanduser() if text else None

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

    def budget_day_start(self, now: datetime) -> datetime:
        """The instant (UTC) the budget day of ``now`` began: midnight in ``PROMPTYOSELF_TIMEZONE``."""
        return timing.day_start(now, self.timezone)

    @property
    def executor_enabled(self) -> bool:
        return self.executor_autostart and self.executor_mode != "off"

    # The service's Unix socket for stdio servers of the same database (promptyoself/faces/relay.py).
    stdio_relay: Literal["auto", "off"] = _field("auto", "PROMPTYOSELF_STDIO_RELAY", "auto or off (any case)")


def accepts(env: str, model: type[BaseSettings] | None = None) -> str:
    """What the variable ``env`` accepts, as the error line and docs/configuration.md say it (a variable
    of ``model``, a plug-in's own settings class, when given; else of ``Settings``)."""
    for field in (model or Settings).model_fields.values():
        if str(field.validation_alias).upper() == env.upper():
            return str(field.description)
    raise KeyError(env)


def env_file() -> str | None:
    """``PROMPTYOSELF_ENV_FILE`` if set, else ``.env`` in the working directory when it exists."""
    explicit = os.environ.get("PROMPTYOSELF_ENV_FILE")
    if explicit:
        return explicit
    return ".env" if Path(".env").is_file() else None


def _env_file_stamp() -> tuple[str | None, int, int]:
    """The ``.env`` file in use, its modification time and size (a cache of what it says is still good
    while these are the same)."""
    path = env_file()
    try:
        stat = Path(path).stat() if path else None
    except OSError:
        stat = None
    return path, (stat.st_mtime_ns if stat else -1), (stat.st_size if stat else -1)


EnvironmentKey = tuple[tuple[str | None, int, int], frozenset[tuple[str, str]]]


def _environment_key() -> EnvironmentKey:
    """What the settings are read from, as a cache key: the ``.env`` file's stamp and the environment."""
    return _env_file_stamp(), frozenset(os.environ.items())


def environment() -> dict[str, str]:
    """The environment over the ``.env`` file (``env_file``), names upper case: what a plug-in that reads
    variables by pattern (not by a settings class) reads. Read again only when either changes."""
    key = _environment_key()
    with _plugin_lock:
        found = _environments.get(key)
    if found is not None:
        return dict(found)
    merged: dict[str, str] = {}
    path = key[0][0]
    if path and Path(path).is_file():
        from dotenv import dotenv_values

        merged.update({k.upper(): v for k, v in dotenv_values(path).items() if v is not None})
    merged.update({k.upper(): v for k, v in os.environ.items()})
    with _plugin_lock:
        _environments.clear()  # one environment at a time is what a process has
        _environments[key] = merged
    return dict(merged)


PS = TypeVar("PS", bound=BaseSettings)
_plugin_lock = threading.Lock()
_plugin_settings: dict[tuple[type[BaseSettings], EnvironmentKey], BaseSettings | ConfigError] = {}
_environments: dict[EnvironmentKey, dict[str, str]] = {}


def read_plugin_settings(model: type[PS]) -> PS:
    """A plug-in's own settings (``model``, a ``PluginSettings``), read from the environment and the
    ``.env`` file that ``Settings`` reads, every value parsed. Kept while neither changes, so a
    plug-in may ask for it on every call. A bad value raises :class:`ConfigError` with the one line naming
    the variable and what it accepts, never the value."""
    now = _environment_key()
    key = (model, now)
    with _plugin_lock:
        found = _plugin_settings.get(key)
    if found is None:
        try:
            found = model(_env_file=now[0][0])
        except ValidationError as exc:
            found = ConfigError(describe_settings_error(exc, model))  # kept too: asked again, the same line
        with _plugin_lock:
            for old in [k for k in _plugin_settings if k[0] is model]:
                del _plugin_settings[old]  # the environment changed: the old answer is no use
            _plugin_settings[key] = found
    if isinstance(found, ConfigError):
        raise ConfigError(found.message)
    return found  # type: ignore[return-value]


def load_settings(**overrides: object) -> Settings:
    """Read settings from env and ``.env``; keyword overrides win (used by tests and CLI flags).

    Every value is parsed into its type here; a bad one raises :class:`ConfigError` with the one line
    that every entry point prints before exiting with code 2. Without ``PROMPTYOSELF_HTTP_TOKEN``, the
    service's token file (``token_file``, written by ``promptyoself token rotate``) gives the token."""
    try:
        values: dict[str, Any] = dict(overrides)  # each checked by its field's validator
        settings = Settings(_env_file=env_file(), **values)  # type: ignore[call-arg]
        if (settings.alert_url is None) != (settings.alert_secret is None):
            have, lack = (("PROMPTYOSELF_ALERT_URL", "PROMPTYOSELF_ALERT_SECRET") if settings.alert_url
                          else ("PROMPTYOSELF_ALERT_SECRET", "PROMPTYOSELF_ALERT_URL"))
            raise ConfigError(f"invalid configuration: {have} is set but {lack} is not (alerts need both)")
        if settings.http_token is None and "http_token" not in overrides:
            stored = read_token_file(token_file(settings.db_url))
            if stored:
                settings = settings.model_copy(update={"http_token": SecretStr(stored)})
        return settings
    except ValidationError as exc:
        raise ConfigError(describe_settings_error(exc)) from exc


def token_file(db_url: str) -> Path:
    """Where the service keeps its bearer token for the database ``db_url``: beside a SQLite file
    (``promptyoself.db`` -> ``promptyoself.db.token``), else in the per-user config folder, one file per
    database URL. Mode 0600. ``promptyoself token rotate`` writes it; ``serve``, ``install-tools`` and
    every command read it when ``PROMPTYOSELF_HTTP_TOKEN`` is not set, so the service's token outlives
    a restart and a new shell."""
    import hashlib

    if db_url.startswith("sqlite:///") and ":memory:" not in db_url and "?" not in db_url:
        return Path(db_url.removeprefix("sqlite:///") + ".token")
    from platformdirs import user_config_dir

    digest = hashlib.sha256(db_url.encode()).hexdigest()[:16]
    return Path(user_config_dir("promptyoself", appauthor=False)) / f"token-{digest}"


def read_token_file(path: Path) -> str | None:
    """The token in ``path`` (stripped), or ``None`` when it is missing, empty or unreadable."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, ValueError):
        return None
    return text if text and not _CONTROL.search(text) else None


def describe_settings_error(exc: ValidationError, model: type[BaseSettings] | None = None) -> str:
    """One line naming each bad variable of ``model`` (default ``Settings``) and what it accepts, never
    the value (it may be a secret)."""
    fields = (model or Settings).model_fields
    aliases = {name: str(field.validation_alias or name).upper() for name, field in fields.items()}
    described = {str(field.validation_alias or name).upper(): str(field.description)
                 for name, field in fields.items()}
    parts: list[str] = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = err.get("loc") or ("?",)
        var = aliases.get(str(loc[0]), str(loc[0]).upper())
        text = f"{var}: expected {described[var]}" if var in described else f"{var}: {err.get('msg', 'invalid')}"
        if text not in parts:
            parts.append(text)
    where = env_file()
    source = f" (read from the environment or {where})" if where and Path(where).is_file() else ""
    return "invalid configuration" + source + ": " + "; ".join(parts)
