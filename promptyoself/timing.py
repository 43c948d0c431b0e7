"""Pure time logic: parse times, intervals and cron rules; compute next runs.

Nothing here does I/O or reads the clock: functions that need "now" take it as a
parameter. Every instant returned is timezone-aware and in UTC.

DST rules (docs/design.md §4), for every wall-clock time read in an IANA zone:

* A wall time inside a spring-forward gap (it never shows on the clock) maps to the
  first instant after the gap: Europe/Berlin 2026-03-29 02:30 -> 03:00 CEST (01:00Z).
* A wall time that happens twice at fall-back maps to its first occurrence (fold=0).
* Cron rules run on wall-clock slots and each slot fires at most once. Slots that
  map to the same instant (02:00 inside the gap and the real 03:00 slot) are one
  firing. The repeated fall-back hour does not fire again: ``0 * * * *`` in Berlin
  on 2026-10-25 fires at 02:00 CEST and *not* at 02:00 CET. So a daily rule fires
  exactly once on every local date, DST or not.
"""

from __future__ import annotations

import functools
import re
import unicodedata
import warnings
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from promptyoself.errors import (
    InvalidArgument,
    InvalidCron,
    InvalidInterval,
    InvalidTime,
    PromptYoSelfError,
    TimeInPast,
)

__all__ = [
    "MAX_INTERVAL",
    "MAX_RULE_CHARS",
    "describe_cron",
    "ensure_aware",
    "ensure_future",
    "format_duration",
    "local_to_utc",
    "next_cron",
    "next_interval_slot",
    "next_run_after",
    "normalize_cron",
    "parse_interval",
    "parse_time",
    "resolve_zone",
    "to_local_iso",
    "to_utc_iso",
]

MAX_RULE_CHARS = 100
MAX_ZONE_CHARS = 64
MAX_INTERVAL = timedelta(days=3660)  # ~10 years
MAX_RELATIVE = timedelta(days=36525)  # ~100 years; far from datetime.max
_MAX_CRON_STEPS = 10_000

_US = timedelta(microseconds=1)
_SEC_US = 1_000_000
_UTC_NAMES = {"UTC", "Z", "GMT", "UT", "ETC/UTC", "ETC/GMT", "ZULU"}

_TIME_FORMS = (
    "Accepted forms: ISO 8601 with offset ('2026-12-25T10:00:00-05:00', "
    "'2026-12-25T15:00:00Z'); a local date-time read in the timezone argument "
    "('2026-12-25 10:00'); '2026-12-25 10:00 UTC'; '2026-12-25 10:00 Europe/Berlin'; "
    "or relative to now ('in 5m', '+2h', 'in 1h30m', 'in 90 seconds', 'in 2 days')."
)
_INTERVAL_FORMS = (
    "Accepted forms: '30s', '5m', '1h', '1d', '1h30m', '2h 15m', bare seconds "
    "('90'), or ISO 8601 durations ('PT15M', 'PT1H30M', 'P1D')."
)
_CRON_FORMS = (
    "Use 5 fields 'minute hour day-of-month month day-of-week', e.g. "
    "'0 9 * * MON-FRI' (09:00 on weekdays), '*/15 * * * *', '30 8 1 JAN *', "
    "or one of @hourly, @daily, @weekly, @monthly, @yearly."
)

_CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_CRON_FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")


def _croniter() -> Any:
    """croniter, imported on first use (it is not needed for the MCP handshake or a list call)."""
    import croniter

    return croniter


def _cron_errors() -> tuple[type[BaseException], ...]:
    return (_croniter().CroniterError, ValueError, KeyError, IndexError, TypeError)


_UNIT_US: dict[str, int] = {}
for _names, _secs in (
    (("s", "sec", "secs", "second", "seconds"), 1),
    (("m", "min", "mins", "minute", "minutes"), 60),
    (("h", "hr", "hrs", "hour", "hours"), 3600),
    (("d", "day", "days"), 86400),
    (("w", "wk", "wks", "week", "weeks"), 604800),
):
    for _n in _names:
        _UNIT_US[_n] = _secs * _SEC_US

_COMPOUND_RE = re.compile(r"(?:\d+\s*[a-z]+[\s,]*)+")
_COMPOUND_PART_RE = re.compile(r"(\d+)\s*([a-z]+)")
_ISO_DURATION_RE = re.compile(
    r"P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?"
    r"(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:[.,]\d{1,6})?)S)?)?"
)
_RELATIVE_RE = re.compile(r"(?:in\s+|\+\s*)(?P<body>.+?)(?:\s+from\s+now)?")
_BRACKET_ZONE_RE = re.compile(r"(?P<body>.+?)\s*\[(?P<zone>[^\]]+)\]")
_SUFFIX_ZONE_RE = re.compile(r"(?P<body>.+?)\s+(?P<zone>[A-Za-z_]+(?:/[A-Za-z0-9_+\-]+)+)")


# ---------------------------------------------------------------------------
# small helpers


def _has_control(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in text)


def _rule_text(value: object, what: str, error: type[PromptYoSelfError], forms: str) -> str:
    """The first checks of every rule text (time, cron, interval): a string of at most
    ``MAX_RULE_CHARS`` characters with no control characters; ``error`` names what is wrong."""
    if not isinstance(value, str):
        raise error(f"{what} must be a string. {forms}")
    if len(value) > MAX_RULE_CHARS:
        raise error(f"{what} is longer than {MAX_RULE_CHARS} characters. {forms}")
    if _has_control(value):
        raise error(f"{what} has control characters (tab, newline). {forms}")
    return value


def _is_naive(dt: datetime) -> bool:
    return dt.tzinfo is None or dt.utcoffset() is None


def ensure_aware(dt: datetime) -> datetime:
    """Return ``dt`` as aware UTC; a naive value is taken to be UTC (old DB rows)."""
    if _is_naive(dt):
        return dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def to_utc_iso(dt: datetime) -> str:
    """ISO 8601 in UTC, e.g. ``2026-11-22T14:40:00+00:00``; naive is a ValueError."""
    if _is_naive(dt):
        raise ValueError("to_utc_iso() needs an aware datetime")
    return dt.astimezone(UTC).isoformat()


def to_local_iso(dt: datetime, tz: ZoneInfo) -> str:
    """ISO 8601 in ``tz`` with its offset, e.g. ``2026-11-22T15:40:00+01:00``."""
    if _is_naive(dt):
        raise ValueError("to_local_iso() needs an aware datetime")
    return dt.astimezone(tz).isoformat()


def format_duration(td: timedelta) -> str:
    """Two largest units: ``2h 5m``, ``45s``, ``1d 3h``; ``0s``; ``250ms`` below 1s."""
    total_us = td // _US
    sign = "-" if total_us < 0 else ""
    total_us = abs(total_us)
    secs = total_us // _SEC_US
    if secs == 0:
        ms = total_us // 1000
        return f"{sign}{ms}ms" if ms else "0s"
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        value, secs = divmod(secs, size)
        if value:
            parts.append(f"{value}{unit}")
    return sign + " ".join(parts[:2])


def resolve_zone(name: str | None, default: str | ZoneInfo = "UTC") -> ZoneInfo:
    """IANA zone name -> ZoneInfo. None/blank means ``default`` (a name, or the parsed setting); UTC/Z/GMT -> UTC."""
    if name is None or not str(name).strip():
        if isinstance(default, ZoneInfo):
            return default
        if default is None or not str(default).strip():
            return ZoneInfo("UTC")
        name = default
    advice = "Use an IANA name such as 'Europe/Berlin' or 'UTC'."
    if not isinstance(name, str):
        raise InvalidArgument(f"Timezone must be a string. {advice}")
    text = name.strip()
    shown = text[:MAX_ZONE_CHARS] + ("..." if len(text) > MAX_ZONE_CHARS else "")
    if len(text) > MAX_ZONE_CHARS or _has_control(text):
        raise InvalidArgument(f"Unknown timezone {shown!r}. {advice}")
    if text.upper() in _UTC_NAMES:
        return ZoneInfo("UTC")
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError, OSError, TypeError):
        raise InvalidArgument(f"Unknown timezone {shown!r}. {advice}") from None


def local_to_utc(naive: datetime, tz: ZoneInfo) -> datetime:
    """Map a wall-clock time in ``tz`` to an aware UTC instant.

    A repeated (fall-back) wall time takes its first occurrence (fold=0); a wall
    time inside a spring-forward gap moves to the first instant after the gap.
    """
    naive = naive.replace(tzinfo=None, fold=0)
    first = naive.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == naive:
        return first
    # Non-existent wall time: fold=0 and fold=1 bracket the transition instant.
    other = naive.replace(tzinfo=tz, fold=1).astimezone(UTC)
    lo, hi = min(first, other), max(first, other)
    lo_offset = lo.astimezone(tz).utcoffset()
    lo_us, hi_us = 0, (hi - lo) // _US
    while hi_us - lo_us > 1:  # binary search for the first instant after the gap
        mid = (lo_us + hi_us) // 2
        if (lo + mid * _US).astimezone(tz).utcoffset() == lo_offset:
            lo_us = mid
        else:
            hi_us = mid
    return lo + hi_us * _US


# ---------------------------------------------------------------------------
# durations


def _compound_us(text: str) -> int | None:
    """'1h30m', '2h 15m', '90 seconds' -> microseconds; None for other shapes."""
    if not _COMPOUND_RE.fullmatch(text):
        return None
    total = 0
    for number, unit in _COMPOUND_PART_RE.findall(text):
        size = _UNIT_US.get(unit)
        if size is None:
            return None
        total += int(number) * size
    return total


def _iso_duration_us(text: str) -> int | None:
    upper = text.upper()
    m = _ISO_DURATION_RE.fullmatch(upper)
    if not m or upper in ("P", "PT") or upper.endswith("T"):
        return None
    total = 0
    for key, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if m.group(key):
            total += int(m.group(key)) * size * _SEC_US
    if m.group("s"):
        whole, _, frac = m.group("s").replace(",", ".").partition(".")
        total += int(whole) * _SEC_US + int((frac or "0").ljust(6, "0"))
    return total


def _interval_text_us(text: str) -> tuple[int, str]:
    shown = _rule_text(text, "Interval", InvalidInterval, _INTERVAL_FORMS).strip()
    body = shown.lower()
    if body.startswith("every "):
        body = body[6:].strip()
    if not body:
        raise InvalidInterval(f"Interval is empty. {_INTERVAL_FORMS}")
    if body.startswith("-"):
        raise InvalidInterval(f"Interval {shown!r} is negative; it must be positive. {_INTERVAL_FORMS}")
    total: int | None
    if body.isascii() and body.isdigit():
        total = int(body) * _SEC_US
    elif body.startswith("p"):
        total = _iso_duration_us(body)
        if total is None and re.search(r"\d+Y|P[^T]*\d+M", body.upper()):
            raise InvalidInterval(
                f"Interval {shown!r} uses years or months, which have no fixed "
                "length. Use days or weeks ('P30D', 'P1W') or a cron rule instead."
            )
    else:
        total = _compound_us(body)
    if total is None:
        raise InvalidInterval(f"Cannot read interval {shown!r}. {_INTERVAL_FORMS}")
    return total, shown


def parse_interval(text: str | int) -> timedelta:
    """'30s', '5m', '1h', '1d', '1h30m', '2h 15m', '90', 90, 'PT15M', 'P1D'."""
    if isinstance(text, bool) or not isinstance(text, int | str):
        raise InvalidInterval(f"Interval must be a string or integer seconds. {_INTERVAL_FORMS}")
    if isinstance(text, int):
        total_us, shown = text * _SEC_US, str(text)
    else:
        total_us, shown = _interval_text_us(text)
    if total_us <= 0:
        raise InvalidInterval(f"Interval {shown!r} must be positive, e.g. '5m'. {_INTERVAL_FORMS}")
    if total_us < _SEC_US:
        raise InvalidInterval(f"Interval {shown!r} is under 1 second; use >= '1s'.")
    if total_us > MAX_INTERVAL // _US:
        raise InvalidInterval(
            f"Interval {shown!r} is longer than {MAX_INTERVAL.days} days (~10 years); use a shorter interval."
        )
    return timedelta(microseconds=total_us)


# ---------------------------------------------------------------------------
# one-time instants


class _BadZoneName(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _dateutil_tzinfos(name: str | None, offset: int | None) -> tzinfo | None:
    """Accept only unambiguous zone names (UTC/GMT/Z) and numeric offsets."""
    if name is None:
        return None if offset is None else timezone(timedelta(seconds=offset))
    if name.upper() in _UTC_NAMES and not offset:
        return UTC
    raise _BadZoneName(name)


_DATEUTIL_ERRORS = (
    ValueError,
    OverflowError,
    TypeError,
    IndexError,
    KeyError,
    AttributeError,
)


def _dateutil_parse(text: str) -> datetime | None:
    """Absolute date-time via python-dateutil; None unless it is a complete date.

    dateutil fills missing fields from a default date (normally today). Parsing
    with two different defaults shows which fields the text did not give; year,
    month and day are required so nothing is filled in from the calendar.
    """
    results: list[datetime] = []
    # naive defaults are deliberate: they are wall-clock placeholders for dateutil
    for default in (datetime(2000, 1, 1), datetime(2001, 2, 2)):  # noqa: DTZ001
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from dateutil import parser as du_parser

                parsed = du_parser.parse(text, default=default, tzinfos=_dateutil_tzinfos)
        except _DATEUTIL_ERRORS:
            return None
        results.append(parsed)
    a, b = results
    if (a.year, a.month, a.day) != (b.year, b.month, b.day):
        return None
    return a


def _to_instant(dt: datetime, tz: ZoneInfo, shown: str) -> datetime:
    try:
        return local_to_utc(dt, tz) if _is_naive(dt) else dt.astimezone(UTC)
    except (OverflowError, ValueError):
        raise InvalidTime(f"Time {shown!r} is out of range. {_TIME_FORMS}") from None


def _parse_relative(body: str, shown: str, now_utc: datetime) -> datetime:
    body = re.sub(r"\ban?\s+", "1 ", body)  # "in an hour"
    body = re.sub(r"\s+and\s+", " ", body)  # "in 1 hour and 30 minutes"
    total_us = _compound_us(body)
    if total_us is None:
        raise InvalidTime(f"Cannot read relative time {shown!r}. {_TIME_FORMS}")
    if total_us > MAX_RELATIVE // _US:
        raise InvalidTime(f"Relative time {shown!r} is more than 100 years ahead; give a nearer time.")
    return now_utc + timedelta(microseconds=total_us)


def parse_time(text: str, *, now: datetime, tz: ZoneInfo) -> datetime:
    """Parse a one-time instant -> aware UTC. Does not check that it is future."""
    shown = _rule_text(text, "Time", InvalidTime, _TIME_FORMS).strip()
    if not shown:
        raise InvalidTime(f"Time is empty. {_TIME_FORMS}")
    lowered = shown.lower()
    if lowered == "now":
        raise InvalidTime("'now' cannot be scheduled; give a future time such as 'in 1m' or 'in 30s'.")
    rel = _RELATIVE_RE.fullmatch(lowered)
    if rel:
        return _parse_relative(rel.group("body"), shown, ensure_aware(now))
    if lowered.startswith("-"):
        raise InvalidTime(f"Time {shown!r} is negative; give a future time ('in 5m').")

    # Optional IANA zone suffix: '... Europe/Berlin' or '...[Europe/Berlin]'
    zone, body = tz, shown
    zm = _BRACKET_ZONE_RE.fullmatch(shown) or _SUFFIX_ZONE_RE.fullmatch(shown)
    if zm:
        try:
            zone = resolve_zone(zm.group("zone"))
        except InvalidArgument as exc:
            raise InvalidTime(f"{exc.message} (in time {shown!r})") from None
        body = zm.group("body")

    try:
        return _to_instant(datetime.fromisoformat(body), zone, shown)
    except ValueError:
        pass
    try:
        parsed = _dateutil_parse(body)
    except _BadZoneName as exc:
        raise InvalidTime(
            f"Timezone abbreviation {exc.name!r} in {shown!r} is ambiguous. Write an "
            "offset ('2026-12-25T10:00:00-05:00'), 'UTC', or an IANA zone name "
            "('2026-12-25 10:00 America/New_York')."
        ) from None
    if parsed is None:
        raise InvalidTime(f"Cannot read time {shown!r} (a full date with the year is required). {_TIME_FORMS}")
    return _to_instant(parsed, zone, shown)


def ensure_future(when: datetime, *, now: datetime, tz: ZoneInfo) -> None:
    """Raise TimeInPast unless ``when`` is strictly after ``now``."""
    when_utc = ensure_aware(when)
    now_utc = ensure_aware(now)
    if when_utc > now_utc:
        return
    local = now_utc.astimezone(tz)
    raise TimeInPast(
        f"Time {to_utc_iso(when_utc)} is in the past; it is now "
        f"{to_utc_iso(now_utc)} ({local:%Y-%m-%d %H:%M} {tz}). "
        "Give a future time, e.g. 'in 5m'."
    )


# ---------------------------------------------------------------------------
# cron


def _cron_fields(normalized: str) -> str:
    """5-field form of a normalized expression (aliases expanded)."""
    return _CRON_ALIASES.get(normalized, normalized)


def normalize_cron(expr: str) -> str:
    """Validate a cron rule; return it with single spaces and upper-case names.

    Aliases are returned lower-case ('@daily').
    """
    if isinstance(expr, str):  # pure, and called several times per cron schedule and delivery
        return _normalized_cron(expr)
    return _normalized_cron.__wrapped__(expr)  # (a wrong type is refused there, unhashable or not)


@functools.lru_cache(maxsize=1024)
def _normalized_cron(expr: str) -> str:
    fields = _rule_text(expr, "Cron rule", InvalidCron, _CRON_FORMS).split()
    if not fields:
        raise InvalidCron(f"Cron rule is empty. {_CRON_FORMS}")
    shown = " ".join(fields)
    if fields[0].startswith("@"):
        alias = fields[0].lower()
        if len(fields) != 1 or alias not in _CRON_ALIASES:
            raise InvalidCron(f"Unknown cron alias {shown!r}. {_CRON_FORMS}")
        return alias
    if len(fields) == 6:
        raise InvalidCron(
            f"Cron rule {shown!r} has 6 fields; a seconds (or year) field is not supported. {_CRON_FORMS}"
        )
    if len(fields) != 5:
        raise InvalidCron(f"Cron rule {shown!r} has {len(fields)} fields, expected 5. {_CRON_FORMS}")
    for name, field in zip(_CRON_FIELD_NAMES, fields, strict=True):
        if not re.fullmatch(r"[0-9A-Za-z*/,\-?#]+", field):
            raise InvalidCron(f"Cron {name} field {field!r} has invalid characters. {_CRON_FORMS}")
    normalized = " ".join(f.upper() for f in fields)
    cr = _croniter()
    try:
        cr.croniter(normalized)
    except _cron_errors() as exc:
        raise InvalidCron(f"Invalid cron rule {shown!r}: {exc}. {_CRON_FORMS}") from None
    try:
        # wall-clock probe: does the rule ever fire (e.g. '0 0 31 2 *' does not)?
        cr.croniter(normalized, datetime(2000, 1, 1)).get_next(datetime)  # noqa: DTZ001
    except cr.CroniterBadDateError:
        raise InvalidCron(
            f"Cron rule {shown!r} never fires (no month has that day). Pick a day "
            "that exists, e.g. '0 0 28 2 *', or 'L' for the last day of the month."
        ) from None
    except _cron_errors() as exc:
        raise InvalidCron(f"Invalid cron rule {shown!r}: {exc}. {_CRON_FORMS}") from None
    return normalized


@functools.lru_cache(maxsize=1024)  # pure (0.5 ms per call in cron_descriptor)
def describe_cron(expr: str) -> str:
    """E.g. 'At 09:00, Monday through Friday'; the expression itself on failure."""
    try:
        from cron_descriptor import Options, get_description

        options = Options(use_24hour_time_format=True, locale_code="en_US")
        return str(get_description(_cron_fields(normalize_cron(expr)), options))
    except Exception:  # cosmetic only: never fail because of a description
        return expr


def next_cron(expr: str, tz: ZoneInfo, after: datetime) -> datetime:
    """First firing strictly after ``after``, on wall-clock time in ``tz``; UTC.

    Slots are generated by croniter on naive wall-clock time (pure calendar
    arithmetic, no DST), then mapped to instants with :func:`local_to_utc`.
    That mapping never goes backwards, so skipping candidates that are not after
    ``after`` yields the next firing, and slots that land on the same instant
    (inside a gap) count once. Naive ``after`` is taken as UTC.
    """
    fields = _cron_fields(normalize_cron(expr))
    after_utc = ensure_aware(after)
    start_wall = after_utc.astimezone(tz).replace(tzinfo=None, fold=0)
    cr = _croniter()
    try:
        it = cr.croniter(fields, start_wall)
        for _ in range(_MAX_CRON_STEPS):
            instant = local_to_utc(it.get_next(datetime), tz)
            if instant > after_utc:
                return instant
    except cr.CroniterBadDateError:
        raise InvalidCron(f"Cron rule {expr!r} never fires after {to_utc_iso(after_utc)}.") from None
    except OverflowError:
        raise InvalidCron(f"Cron rule {expr!r} has no firing before 9999.") from None
    raise InvalidCron(f"Cron rule {expr!r}: no firing found after {after_utc}.")


# ---------------------------------------------------------------------------
# intervals and dispatch


def next_interval_slot(start: datetime, every: timedelta, after: datetime) -> datetime:
    """Smallest ``start + k*every`` (k >= 0) strictly after ``after``; exact, O(1)."""
    if every <= timedelta(0):
        raise InvalidInterval("Interval must be positive, e.g. '5m'.")
    start_utc = ensure_aware(start)
    after_utc = ensure_aware(after)
    if start_utc > after_utc:
        return start_utc
    k = (after_utc - start_utc) // every + 1  # integer microsecond arithmetic
    return start_utc + k * every


def next_run_after(
    schedule_type: str,
    schedule_value: str,
    tz: ZoneInfo,
    *,
    after: datetime,
    anchor: datetime | None = None,
) -> datetime | None:
    """Next run strictly after ``after``: None for 'once'; cron; fixed-rate interval."""
    if schedule_type == "once":
        return None
    if schedule_type == "cron":
        return next_cron(schedule_value, tz, after)
    if schedule_type == "interval":
        if anchor is None:
            raise InvalidArgument("An interval schedule needs its start time (anchor) for the next run.")
        return next_interval_slot(anchor, parse_interval(schedule_value), after)
    raise InvalidArgument(f"Unknown schedule type {schedule_type!r}; use 'once', 'cron' or 'interval'.")


def day_start(now: datetime, tz: ZoneInfo) -> datetime:
    """The instant (UTC) the day of ``now`` began in ``tz``: where daily delivery budgets reset."""
    local = ensure_aware(now).astimezone(tz)
    return local_to_utc(datetime(local.year, local.month, local.day), tz)  # noqa: DTZ001 (wall clock in tz)
