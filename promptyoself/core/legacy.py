"""Import a database written by the earlier PromptYoSelf (``python -m promptyoself import-legacy PATH``).

The earlier version kept every reminder in one SQLite table, ``unified_reminders``: ``message``,
``agent_id``, ``schedule_type`` (``once``/``cron``/``interval``), ``schedule_value``, ``active``,
``next_run`` (naive UTC, stored as text), ``max_repetitions``, ``repetition_count``, and optionally
``created_at``/``last_run``. Rows without an ``agent_id`` belonged to its web interface.

Each active row becomes one schedule with the same agent, text, rule, next run (aware UTC) and
repetition counts, in timezone UTC (the earlier version evaluated cron rules in UTC). Interval rules
are anchored at the legacy ``next_run`` so the fixed-rate slots continue where they were. The legacy
file is opened read-only and never changed.

Importing is idempotent: every imported schedule carries the idempotency key
``legacy:<sha256 of the legacy id, text, type and rule>`` (unique per agent), so running the import
again, or on a copy of the file elsewhere, skips what is already there. A bad row is reported in
``errors`` and does not stop the others.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from promptyoself import timing
from promptyoself.core.agents import normalize_agent_id
from promptyoself.core.results import LegacyImportResult, LegacyRowError
from promptyoself.errors import InvalidArgument, PromptYoSelfError
from promptyoself.store.legacy import LegacyRow, read_reminders
from promptyoself.store.records import ScheduleRow

if TYPE_CHECKING:
    from promptyoself.core.operations import Core

log = logging.getLogger(__name__)

KEY_PREFIX = "legacy:"

TYPE_ALIASES: dict[str, str] = {
    **dict.fromkeys(
        ("once", "one-time", "one_time", "onetime", "one time", "one-off", "oneoff", "single", "date",
         "at", "time", "datetime"),
        "once",
    ),
    **dict.fromkeys(("cron", "crontab", "cron_expression", "cron-expression"), "cron"),
    **dict.fromkeys(("interval", "every", "repeat", "repeating", "recurring", "periodic"), "interval"),
}
_TRUE = {"1", "true", "t", "yes", "y", "on", "active"}
_FALSE = {"0", "false", "f", "no", "n", "off", "inactive", ""}


class RowError(Exception):
    """One legacy row that cannot be imported; reported, never fatal."""

    def __init__(self, message: str, code: str = "invalid_argument") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def _shown(path: object) -> str:
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else repr(path)
    text = str(text)
    return text if len(text) <= 200 else text[:200] + "..."


def _legacy_file(path: object) -> Path:
    """The legacy file's resolved path, after checking that it is a path to an existing file."""
    if not isinstance(path, (str, os.PathLike)) or not str(os.fspath(path)).strip():
        raise InvalidArgument("Give the path of the earlier PromptYoSelf database file (SQLite).")
    shown = _shown(path)
    try:
        file = Path(os.fspath(path)).expanduser().resolve()
        exists = file.is_file()
    except (OSError, ValueError, RuntimeError):
        exists = False
    if not exists:
        raise InvalidArgument(
            f"No legacy database at {shown!r}: the file does not exist or is not a regular file. "
            "Give the path of the earlier PromptYoSelf SQLite file (often promptyoself.db)."
        )
    return file


# ---- reading one row ------------------------------------------------------------------------


def parse_legacy_datetime(value: object, name: str) -> datetime | None:
    """A legacy timestamp -> aware UTC. Naive text is UTC ('2025-01-02 09:00:00', ISO with 'T'
    and microseconds); an explicit offset is honoured; numbers are Unix seconds."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise RowError(f"{name} {value!r} is not a date-time.")
    if isinstance(value, (int, float)):
        try:
            return datetime.fromtimestamp(float(value), UTC)
        except (OverflowError, OSError, ValueError):
            raise RowError(f"{name} {value!r} is out of range.") from None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise RowError(f"{name} {value!r} is not a date-time.")
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text.replace(" UTC", "").replace("Z", "+00:00"))
    except ValueError:
        raise RowError(f"{name} {text[:60]!r} is not a date-time such as '2025-01-02 09:00:00'.") from None
    return timing.ensure_aware(parsed)


def _is_active(value: object) -> bool:
    if value is None:  # the earlier schema defaulted to active
        return True
    if isinstance(value, (int, float)):
        return bool(value)
    text = (value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise RowError(f"active {text[:20]!r} is neither 0 nor 1.")


def _as_int(value: object, name: str) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value.strip()) < 19:
        return int(value.strip())
    raise RowError(f"{name} {value!r} is not a whole number.")


def normalize_type(value: object) -> str:
    text = str(value or "").strip().lower()
    kind = TYPE_ALIASES.get(text) or TYPE_ALIASES.get(text.replace("_", "-"))
    if kind is None:
        raise RowError(
            f"schedule_type {text[:30]!r} is not one of once, cron, interval.", "invalid_argument"
        )
    return kind


def legacy_key(legacy_id: object, message: str, kind: str, value: str) -> str:
    """The idempotency key of an imported row: the same row imports once, from any path."""
    digest = hashlib.sha256(
        "\x1f".join((str(legacy_id), message, kind, value)).encode("utf-8", "surrogatepass")
    ).hexdigest()
    return f"{KEY_PREFIX}{digest[:40]}"


def convert_row(row: Mapping[str, object], core: Core, now: datetime) -> ScheduleRow | None:
    """A legacy row as the column values of a new schedule, or ``None`` for an inactive/finished one.

    Raises RowError for a row that cannot be imported.
    """
    if not _is_active(row.get("active")):
        return None
    try:
        agent = normalize_agent_id(row.get("agent_id"))
    except InvalidArgument as exc:
        raise RowError(exc.message) from None
    if agent is None:
        raise RowError("agent_id is empty (a reminder of the earlier web interface?); nothing to deliver to.")
    message = row.get("message")
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    if not isinstance(message, str) or not message.strip():
        raise RowError("message is empty.")
    limit = core.settings.max_prompt_chars
    if len(message) > limit:
        raise RowError(
            f"message is {len(message)} characters; the limit is {limit} (PROMPTYOSELF_MAX_PROMPT_CHARS).",
            "quota_exceeded",
        )
    if "\x00" in message:
        raise RowError("message contains a NUL character.")
    kind = normalize_type(row.get("schedule_type"))
    raw_value = row.get("schedule_value")
    value = "" if raw_value is None else str(raw_value).strip()
    next_run = parse_legacy_datetime(row.get("next_run"), "next_run")
    reps = _as_int(row.get("repetition_count"), "repetition_count") or 0
    max_reps = _as_int(row.get("max_repetitions"), "max_repetitions")
    if reps < 0:
        raise RowError(f"repetition_count {reps} is negative.")
    if max_reps is not None and max_reps < 1:
        max_reps = None  # the earlier version wrote 0 or -1 for "no limit" in places
    anchor = None
    try:
        if kind == "once":
            if next_run is None:
                next_run = parse_legacy_datetime(value, "schedule_value")
            if next_run is None:
                raise RowError("a one-time row needs next_run (or a date-time in schedule_value).")
            if not value or len(value) > timing.MAX_RULE_CHARS:
                value = timing.to_utc_iso(next_run)
            max_reps = None
        elif kind == "cron":
            value = timing.normalize_cron(value)
            if next_run is None:
                next_run = timing.next_cron(value, timing.resolve_zone("UTC"), now)
        else:
            step = timing.parse_interval(value)
            if step < core.settings.min_interval:
                raise RowError(
                    f"interval {value!r} is shorter than the minimum interval {core.settings.min_interval} "
                    "(PROMPTYOSELF_MIN_INTERVAL).",
                    "interval_too_short",
                )
            if next_run is None:
                next_run = now + step
            anchor = next_run
    except PromptYoSelfError as exc:
        raise RowError(exc.message, exc.code) from None
    if max_reps is not None and reps >= max_reps:
        return None  # already delivered as often as it was meant to be
    created = _optional_time(row, "created_at") or now
    return ScheduleRow(
        agent_id=agent,
        prompt_text=message,
        schedule_type=kind,
        schedule_value=value,
        timezone="UTC",
        next_run=next_run,
        due_at=next_run,
        anchor=anchor,
        created_at=created,
        updated_at=now,
        last_run=_optional_time(row, "last_run"),
        max_repetitions=max_reps,
        repetition_count=reps,
        idempotency_key=legacy_key(row.get("id"), message, kind, value),
    )


def _short(value: object) -> object:
    """A legacy value safe to echo in a report: short text or a number, else a truncated repr."""
    if value is None or isinstance(value, (int, float)):
        return value
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 100 else text[:100] + "..."


def _optional_time(row: Mapping[str, object], name: str) -> datetime | None:
    """Timestamps that are nice to keep but never worth failing a row over."""
    try:
        return parse_legacy_datetime(row.get(name), name)
    except RowError:
        return None


# ---- the import -------------------------------------------------------------------------------


def import_legacy(
    core: Core, path: object, progress: Callable[[int, int], None] | None = None
) -> LegacyImportResult:
    """Import the active rows of an earlier PromptYoSelf database into ``core``'s store.

    Returns ``{status, path, imported, skipped_existing, skipped_inactive, errors:[{legacy_id,
    agent_id, error, code}], imported_ids, message}``. A missing file or a file without the
    ``unified_reminders`` table raises InvalidArgument.
    """
    from promptyoself.store import schedules
    from promptyoself.store.policy import load

    file = _legacy_file(path)
    rows = read_reminders(file, _shown(path))

    now = core.now()
    store = core.store
    limit = load(store, core.settings, now).max_active_per_agent  # the database's policy (an import is SQL only)
    live: dict[str, int] = {}
    imported_ids: list[int] = []
    errors: list[LegacyRowError] = []
    skipped_existing = skipped_inactive = 0

    for row in _reporting(rows, progress):
        legacy_id, shown_agent = row.get("id"), _short(row.get("agent_id"))
        try:
            new = convert_row(row, core, now)
        except RowError as exc:
            errors.append({"legacy_id": legacy_id, "agent_id": shown_agent, "error": exc.message, "code": exc.code})
            continue
        if new is None:
            skipped_inactive += 1
            continue
        agent, key = new.agent_id, new.idempotency_key
        assert key is not None  # convert_row always sets the legacy key
        if schedules.by_idempotency_key(store, agent, key) is not None:
            skipped_existing += 1
            continue
        if agent not in live:
            live[agent] = schedules.count_live(store, agent)
        quota = f"the limit is {limit} (the operator's policy max_active_per_agent)."
        if live[agent] >= limit:
            errors.append({"legacy_id": legacy_id, "agent_id": shown_agent, "code": "quota_exceeded",
                           "error": f"Agent {agent} already has {live[agent]} live schedules; {quota}"})
            continue
        try:  # counted again in the insert's transaction: a concurrent writer cannot push it over
            created = schedules.create_schedule(store, new, schedules.CreationLimits(max_live=limit))
        except schedules.QuotaReached as full:
            live[agent] = full.live
            errors.append({"legacy_id": legacy_id, "agent_id": shown_agent, "code": "quota_exceeded",
                           "error": f"Agent {agent} already has {full.live} live schedules; {quota}"})
            continue
        except schedules.DuplicateKey:  # another import of the same file got there first
            skipped_existing += 1
            continue
        live[agent] += 1
        imported_ids.append(created.id)

    if imported_ids:
        core.changed()
    log.info(
        "legacy import from %s: %d imported, %d already there, %d inactive, %d errors",
        file, len(imported_ids), skipped_existing, skipped_inactive, len(errors),
    )
    message = (
        f"Imported {len(imported_ids)} schedule(s) from {file.name}; {skipped_existing} already "
        f"imported, {skipped_inactive} inactive or finished"
    )
    message += f", {len(errors)} could not be imported (see errors)." if errors else "."
    return {
        "status": "success",
        "path": str(file),
        "imported": len(imported_ids),
        "skipped_existing": skipped_existing,
        "skipped_inactive": skipped_inactive,
        "errors": errors,
        "imported_ids": imported_ids,
        "message": message,
    }


def _reporting(
    rows: Sequence[LegacyRow], progress: Callable[[int, int], None] | None
) -> Iterator[LegacyRow]:
    """``rows``, calling ``progress(done, total)`` before the first and after each one (the CLI's bar)."""
    if progress is not None:
        progress(0, len(rows))
    for done, row in enumerate(rows, 1):
        yield row
        if progress is not None:
            progress(done, len(rows))
