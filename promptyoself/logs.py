"""Logging: stderr always (never stdout), optionally a rotating file and JSON lines."""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from promptyoself.config import Settings


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class RedactSecrets(logging.Filter):
    """Replace any configured secret that slips into a log line."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if len(s) >= 4]

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        msg = record.getMessage()
        if any(s in msg for s in self.secrets):
            for s in self.secrets:
                msg = msg.replace(s, "***")
            record.msg, record.args = msg, None
        return True


def settings_secrets(settings: Settings) -> list[str]:
    found = [
        s.get_secret_value()
        for s in (settings.letta_api_key, settings.letta_server_password, settings.http_token)
        if s is not None and s.get_secret_value()
    ]
    from sqlalchemy.engine import make_url

    try:
        password = make_url(settings.db_url).password
    except Exception:
        password = None
    if password:
        found.append(str(password))
    return found


def setup_logging(settings: Settings, *, stream: Any = None) -> None:
    """Configure the root logger once: stderr, plus ``PROMPTYOSELF_LOG_FILE`` (rotating) if set."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_promptyoself", False):
            root.removeHandler(handler)
    level = getattr(logging, settings.log_level.upper(), logging.INFO)
    fmt: logging.Formatter = (
        JsonFormatter()
        if settings.log_json
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    redact = RedactSecrets(settings_secrets(settings))
    handlers: list[logging.Handler] = [logging.StreamHandler(stream or sys.stderr)]
    if settings.log_file:
        path = Path(settings.log_file).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(
            logging.handlers.RotatingFileHandler(path, maxBytes=5_000_000, backupCount=3, encoding="utf-8")
        )
    for handler in handlers:
        handler.setFormatter(fmt)
        handler.addFilter(redact)
        handler._promptyoself = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "alembic"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
