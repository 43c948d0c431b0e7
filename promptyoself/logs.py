"""Logging: stderr always (never stdout), optionally a rotating file and JSON lines.

``PROMPTYOSELF_LOG_LEVEL`` sets the level, ``PROMPTYOSELF_LOG_FILE`` adds a rotating file
(``PROMPTYOSELF_LOG_MAX_BYTES`` per file, ``PROMPTYOSELF_LOG_BACKUPS`` old files kept) and
``PROMPTYOSELF_LOG_JSON`` writes one JSON object per line to every handler. Every handler redacts
the configured secrets (Letta key and password, HTTP token, a password in a database or Letta URL),
in the message and in tracebacks. FastMCP's and uvicorn's loggers are routed through the same
handlers, so one format and one redaction apply to everything the process logs.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, quote_plus

from promptyoself.config import REDACTED, Settings, redact_credentials, url_secrets

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Loggers that install their own handlers; we route them through ours instead.
FOREIGN_LOGGERS = ("fastmcp", "uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")
# Loggers too chatty (or too close to the wire: request headers) below WARNING.
QUIET_LOGGERS = ("httpx", "httpcore", "httpx2", "alembic", "sse_starlette", "asyncio")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg (+ exc when there is a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


def secret_variants(secret: str) -> list[str]:
    """The forms a secret may take in text: as is, and percent-encoded as in a URL."""
    forms = {secret, quote(secret, safe=""), quote_plus(secret, safe="")}
    return sorted(forms, key=len, reverse=True)


SPACED_MIN = 8
"""Secrets this long or longer are also found with white space between their characters."""


def _spaced(secret: str) -> str:
    """A pattern for ``secret`` as is and with white space anywhere between its characters (a copy
    split into groups, or spelt out one character at a time, in an echoed error: issue 42 item 14)."""
    if len(secret) < SPACED_MIN:
        return re.escape(secret)
    return r"\s*".join(re.escape(c) for c in secret)


@functools.lru_cache(maxsize=64)
def _secrets_pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """One case-insensitive pattern matching any of ``secrets`` (the longest first), also spaced out."""
    found = sorted({s for s in secrets if s}, key=len, reverse=True)
    return re.compile("|".join(_spaced(s) for s in found), re.IGNORECASE) if found else None


def redact(text: str, secrets: list[str]) -> str:
    """``text`` with every secret replaced, in any letter case (an upper-cased copy of a key, a
    percent-encoding in upper or lower hex, is the same secret)."""
    pattern = _secrets_pattern(tuple(secrets))
    return pattern.sub(REDACTED, text) if pattern is not None else text


class RedactSecrets(logging.Filter):
    """Replace any configured secret that slips into a log line or a traceback."""

    def __init__(self, secrets: list[str], later: Callable[[], Iterable[str]] | None = None) -> None:
        """``later`` adds more secrets, asked on the first record filtered (or ``secrets`` read): the
        targets' own, whose plug-ins a process that never logs need not load at start."""
        super().__init__()
        self._given = list(secrets)
        self._later = later
        self._secrets: list[str] | None = None if later is not None else self._variants(self._given)

    @staticmethod
    def _variants(secrets: Iterable[str]) -> list[str]:
        found: set[str] = set()
        for s in secrets:
            if len(s) >= 4:
                found.update(v for v in secret_variants(s) if len(v) >= 4)
        return sorted(found, key=len, reverse=True)

    @property
    def secrets(self) -> list[str]:
        """Every form of every secret hidden, the longest first."""
        if self._secrets is None:
            more = list(self._later()) if self._later is not None else []
            self._secrets = self._variants([*self._given, *more])
        return self._secrets

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        try:
            msg = record.getMessage()
        except Exception:  # a bad format string: log what we have, as text
            msg = f"{record.msg} {record.args}"
        clean = redact(msg, self.secrets)
        if clean != msg or record.args:
            record.msg, record.args = clean, None
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = redact(record.exc_text, self.secrets)
        elif record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, self.secrets)
        return True


def settings_secrets(settings: Settings, *, sources: bool = True) -> list[str]:
    """Every secret the settings hold: keys, passwords, the HTTP token, passwords inside URLs; and,
    unless ``sources`` is False, those of the registered secret sources (the targets' own settings)."""
    found = [
        s.get_secret_value()
        for s in (settings.letta_api_key, settings.letta_server_password, settings.http_token, settings.agent_token)
        if s is not None and s.get_secret_value()
    ]
    stripped = [s.strip() for s in found if s.strip() != s]
    found.extend(s for s in stripped if s)
    for url in (settings.db_url, settings.letta_base_url):
        found.extend(url_secrets(url))
    if sources:
        found.extend(source_secrets())  # the targets' own: an endpoint URL's path may be its credential
    return found


def source_secrets() -> list[str]:
    """What the registered secret sources (``add_secret_source``) return now."""
    found: list[str] = []
    for source in list(_sources):
        try:
            found.extend(s for s in source() if s)
        except Exception:  # a source that fails hides nothing more; it never stops logging
            logging.getLogger(__name__).debug("a secret source failed", exc_info=True)
    return found


_sources: list[Callable[[], Iterable[str]]] = []


def add_secret_source(source: Callable[[], Iterable[str]]) -> None:
    """Have ``settings_secrets`` (the log filter, the history's ``Redactor``) also hide what ``source()``
    returns, asked each time they are made: the delivery targets' own secrets (``registry.secrets``,
    each plug-in's optional ``secrets()``), registered by the rooms that may read the registry (the
    faces before ``setup_logging``, ``delivery.bridge`` when it is imported), since this shared leaf
    imports no room. Adding the same source twice adds it once."""
    if source not in _sources:
        _sources.append(source)


def redact_text(text: str, secrets: list[str]) -> str:
    """``text`` with the configured secrets (and their URL-encoded forms) replaced as in the logs, a
    tail that starts a secret (text cut at a length limit) too, and any ``Bearer <credential>``."""
    text = redact(text, secrets)
    for secret in secrets:  # the text may have been cut in the middle of a secret (in any case)
        n = _cut_secret(text, secret)
        if n:
            text = text[:-n] + REDACTED
    return redact_credentials(text)


def _cut_secret(text: str, secret: str) -> int:
    """The length of the longest tail of ``text`` (4 characters at least, shorter than ``secret``)
    that starts ``secret`` in any letter case; 0 when none does. In ASCII, where lowering is one
    character for one, only the places where the secret's first character stands are tried."""
    most = min(len(secret) - 1, len(text))
    if most < 4:
        return 0
    tail = text[-most:]
    if not (tail.isascii() and secret.isascii()):
        return next((n for n in range(most, 3, -1) if text[-n:].lower() == secret[:n].lower()), 0)
    tail, head = tail.lower(), secret[:most].lower()
    at = tail.find(head[0], 0, most - 3)
    while at != -1:
        if tail.startswith(head[:most - at], at):
            return most - at
        at = tail.find(head[0], at + 1, most - 3)
    return 0


class Redactor:
    """The log filter's redaction for text that is stored rather than logged (delivery history)."""

    def __init__(self, settings: Settings) -> None:
        self.secrets = RedactSecrets(settings_secrets(settings)).secrets

    def __call__(self, text: str | None) -> str | None:
        return None if text is None else redact_text(text, self.secrets)


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record, never to stdout.

    Looking the stream up per record keeps logging working when ``sys.stderr`` is replaced after
    set-up (test capture, embedding hosts) instead of writing to a closed or stale stream.
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def _is_ours(handler: logging.Handler) -> bool:
    return bool(getattr(handler, "_promptyoself", False))


def setup_logging(settings: Settings, *, stream: Any = None) -> None:
    """Configure the root logger: stderr, plus ``PROMPTYOSELF_LOG_FILE`` (rotating) if set.

    Safe to call again (it replaces its own handlers). Never writes to stdout: in stdio mode stdout
    carries JSON-RPC only.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if _is_ours(handler):
            root.removeHandler(handler)
            handler.close()
    level = getattr(logging, settings.log_level)  # validated and upper-cased when the settings loaded
    fmt: logging.Formatter = JsonFormatter() if settings.log_json else logging.Formatter(TEXT_FORMAT)
    # the targets' secrets are read with the first record: from the first line on, at no cost to a start
    redactor = RedactSecrets(settings_secrets(settings, sources=False), later=source_secrets)
    handlers: list[logging.Handler] = [logging.StreamHandler(stream) if stream is not None else StderrHandler()]
    if settings.log_file:
        path = settings.log_file  # a Path, ~ expanded when the settings loaded
        path.parent.mkdir(parents=True, exist_ok=True)
        from logging.handlers import RotatingFileHandler  # only with a log file: it imports pickle and queue

        handlers.append(
            RotatingFileHandler(
                path,
                maxBytes=settings.log_max_bytes,
                backupCount=settings.log_backups,
                encoding="utf-8",
            )
        )
    for handler in handlers:
        handler.setFormatter(fmt)
        handler.addFilter(redactor)
        handler._promptyoself = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)
    for name in FOREIGN_LOGGERS:
        foreign = logging.getLogger(name)
        for handler in list(foreign.handlers):
            foreign.removeHandler(handler)
        foreign.propagate = True
        foreign.setLevel(logging.NOTSET)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    # captureWarnings(True) does nothing while logging believes it already captures, even when someone
    # (warnings.catch_warnings, a test runner) has since put warnings.showwarning back: release, then capture.
    logging.captureWarnings(False)
    logging.captureWarnings(True)


def reset_logging() -> None:
    """Remove the handlers ``setup_logging`` installed (tests)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if _is_ours(handler):
            root.removeHandler(handler)
            handler.close()
    logging.captureWarnings(False)
