"""Pure time logic: zones, intervals, cron and RFC 5545 rules; next runs; the missed-run rule.

Nothing here does I/O or reads the clock: functions that need "now" take it as a
parameter. Every instant returned is timezone-aware and in UTC. What people write for a
one-time instant is read in ``promptyoself/phrases.py``; RRULEs and natural recurrence are
read (and described) in ``promptyoself/recurrence.py``, which hands this module the normal
form that ``next_rrule`` iterates.

DST rules (docs/design.md §4), for every wall-clock time read in an IANA zone:

* A wall time inside a spring-forward gap (it never shows on the clock) maps to the
  first instant after the gap: Europe/Berlin 2026-03-29 02:30 -> 03:00 CEST (01:00Z).
* A wall time that happens twice at fall-back maps to its first occurrence (fold=0).
* Cron rules run on wall-clock slots and each slot fires at most once. Slots that
  map to the same instant (02:00 inside the gap and the real 03:00 slot) are one
  firing. The repeated fall-back hour does not fire again: ``0 * * * *`` in Berlin
  on 2026-10-25 fires at 02:00 CEST and *not* at 02:00 CET. So a daily rule fires
  exactly once on every local date, DST or not.
* RRULEs follow RFC 5545 §3.3.10 instead: a wall time inside a gap keeps the offset
  from before the gap (Berlin 02:30 -> 03:30 CEST, 01:30Z); a repeated one is the first.
"""

from __future__ import annotations

import difflib
import functools
import re
import unicodedata
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from promptyoself.errors import (
    InvalidArgument,
    InvalidCron,
    InvalidInterval,
    OutOfRange,
    PromptYoSelfError,
)

__all__ = [
    "FIRST_INSTANT",
    "LAST_INSTANT",
    "MAX_INTERVAL",
    "MAX_RULE_CHARS",
    "RULE_HORIZON_YEARS",
    "check_in_range",
    "cron_instants",
    "describe_cron",
    "ensure_aware",
    "format_duration",
    "interval_slots_fit",
    "local_to_utc",
    "next_cron",
    "next_interval_slot",
    "next_rrule",
    "next_run_after",
    "normalize_cron",
    "parse_interval",
    "resolve_zone",
    "rfc5545_to_utc",
    "rrule_instants",
    "to_local_iso",
    "to_utc_iso",
]

MAX_RULE_CHARS = 100
FIRST_INSTANT = datetime(1, 1, 3, tzinfo=UTC)
LAST_INSTANT = datetime(9999, 12, 29, tzinfo=UTC)
"""The instants a schedule may use: every timezone can show them (offsets are within a day of UTC) and
a day after the last is still a date (the calendar ends with 9999-12-31)."""
INTERVAL_SLOTS_SHOWN = 5
MAX_ZONE_CHARS = 64
MAX_INTERVAL = timedelta(days=3660)  # ~10 years
_MAX_CRON_STEPS = 10_000

_US = timedelta(microseconds=1)
_SEC_US = 1_000_000
_UTC_NAMES = {"UTC", "Z", "GMT", "UT", "ETC/UTC", "ETC/GMT", "ZULU"}
_ABBREVIATIONS = {  # zone abbreviations people write -> the IANA zone suggested instead
    "EST": "America/New_York", "EDT": "America/New_York", "CST": "America/Chicago", "CDT": "America/Chicago",
    "MST": "America/Denver", "MDT": "America/Denver", "PST": "America/Los_Angeles", "PDT": "America/Los_Angeles",
    "AKST": "America/Anchorage", "AKDT": "America/Anchorage", "HST": "Pacific/Honolulu", "CET": "Europe/Berlin",
    "CEST": "Europe/Berlin", "MET": "Europe/Berlin", "MEST": "Europe/Berlin", "EET": "Europe/Athens",
    "EEST": "Europe/Athens", "WET": "Europe/Lisbon", "WEST": "Europe/Lisbon", "BST": "Europe/London",
    "IST": "Asia/Kolkata", "JST": "Asia/Tokyo", "KST": "Asia/Seoul", "AEST": "Australia/Sydney",
    "AEDT": "Australia/Sydney", "ACST": "Australia/Adelaide", "AWST": "Australia/Perth",
    "NZST": "Pacific/Auckland", "NZDT": "Pacific/Auckland", "SAST": "Africa/Johannesburg", "MSK": "Europe/Moscow",
}

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


@functools.cache
def _zone_names() -> dict[str, str]:
    """Every IANA name this machine knows, by its upper-case spelling (read once, when a name is not
    found as written)."""
    return {name.upper(): name for name in available_timezones()}


def _zone_suggestion(text: str) -> str:
    """' Did you mean ...?' for a near miss: a city alone ('Berlin'), spaces for underscores, a typo."""
    names = _zone_names()
    key = text.upper().replace(" ", "_")
    cities = sorted(n for u, n in names.items() if u.rsplit("/", 1)[-1] == key and "/" in n)
    found = cities or difflib.get_close_matches(key, list(names), n=3, cutoff=0.8)
    found = [names.get(f, f) for f in found][:3]
    return f" Did you mean {' or '.join(repr(f) for f in found)}?" if found else ""


def abbreviation_advice(name: str) -> str | None:
    """What to write instead of a zone abbreviation ('EST'), or None when ``name`` is not one. One rule
    for the timezone argument and a zone written in a time: abbreviations are refused in both (IANA
    keeps a few, EST and CET among them, as fixed offsets that ignore daylight saving)."""
    zone = _ABBREVIATIONS.get(name.strip().upper())
    if zone is None:
        return None
    return (f"Timezone abbreviation {name.strip()!r} is ambiguous (which places? with daylight saving?): write "
            f"the IANA name, e.g. {zone!r}, or an offset in the time ('2026-12-25T10:00:00-05:00').")


def resolve_zone(name: str | None, default: str | ZoneInfo = "UTC") -> ZoneInfo:
    """IANA zone name, in any case -> ZoneInfo. None/blank means ``default`` (a name, or the parsed
    setting); UTC/Z/GMT -> UTC. An unknown name is ``invalid_argument`` naming the nearest ones."""
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
    abbreviation = abbreviation_advice(text)
    if abbreviation is not None:
        raise InvalidArgument(abbreviation)
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError, OSError, TypeError):
        pass
    spelled = _zone_names().get(text.upper())
    if spelled is not None:
        return ZoneInfo(spelled)
    raise InvalidArgument(f"Unknown timezone {shown!r}.{_zone_suggestion(text)} {advice}") from None


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


@functools.lru_cache(maxsize=1024)  # pure; a listed interval schedule reads its rule once per next run
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
    return next(cron_instants(expr, tz, after))


def cron_instants(expr: str, tz: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """Every firing strictly after ``after``, in order, as ``next_cron`` finds each: one croniter walks
    the wall-clock slots (a rule is parsed once, not once per firing: ``upcoming`` lists several)."""
    fields = _cron_fields(normalize_cron(expr))
    last = ensure_aware(after)
    start_wall = last.astimezone(tz).replace(tzinfo=None, fold=0)
    cr = _croniter()
    try:
        walls = _wall_slots(fields, start_wall)
        while True:
            for _ in range(_MAX_CRON_STEPS):
                instant = local_to_utc(next(walls), tz)
                if instant > last:
                    break
            else:
                raise InvalidCron(f"Cron rule {expr!r}: no firing found after {last}.")
            last = instant
            yield instant
    except cr.CroniterBadDateError:
        raise InvalidCron(f"Cron rule {expr!r} never fires after {to_utc_iso(last)}.") from None
    except OverflowError:
        raise InvalidCron(f"Cron rule {expr!r} has no firing before 9999.") from None


class _WallSpan:
    """The wall-clock slots of one cron rule remembered over a span: ``span`` is ``(lo, slots)``, every
    slot of the rule after the naive wall time ``lo`` up to ``slots[-1]``, in order (one tuple, replaced
    whole, so a reader in another thread sees an old span or a new one, each complete)."""

    __slots__ = ("span",)

    def __init__(self) -> None:
        self.span: tuple[datetime, tuple[datetime, ...]] | None = None


_WALL_SPAN_MAX = 4096
"""Slots kept per rule (the newest, when a span grows past it)."""
_WALL_BRIDGE = 256
"""Slots stepped to join a start just outside a rule's span to it, before starting a span afresh."""


@functools.lru_cache(maxsize=512)
def _wall_span(fields: str) -> _WallSpan:
    return _WallSpan()


def _wall_slots(fields: str, start: datetime) -> Iterator[datetime]:
    """Every wall-clock slot of the rule ``fields`` strictly after the naive ``start``, in order: what
    one croniter from ``start`` yields by ``get_next``. A rule's slots do not depend on where a walk
    starts, so they are remembered per rule (``_WallSpan``) and a start inside the span is served by a
    bisection: ``list`` shows many schedules of the same rule from different next runs, and croniter
    costs ~0.1 ms per slot. croniter's errors (a rule that stops firing) are raised as they were."""
    from bisect import bisect_right

    cr = _croniter()
    holder = _wall_span(fields)
    span = holder.span
    if span is None or start < span[0] or start >= span[1][-1]:
        span = _span_over(cr, fields, start, span)
        holder.span = span
    lo, slots = span
    i = bisect_right(slots, start)
    yield from slots[i:]
    fresh: list[datetime] = []
    try:  # past the span: walk on from its last slot, and remember what was walked
        it = cr.croniter(fields, slots[-1])
        while True:
            slot = it.get_next(datetime)
            fresh.append(slot)
            yield slot
    finally:
        if fresh and holder.span is span:
            grown = slots + tuple(fresh)
            if len(grown) > _WALL_SPAN_MAX:
                lo, grown = grown[-_WALL_SPAN_MAX - 1], grown[-_WALL_SPAN_MAX:]
            holder.span = (lo, grown)


def _span_over(cr: Any, fields: str, start: datetime,
               span: tuple[datetime, tuple[datetime, ...]] | None) -> tuple[datetime, tuple[datetime, ...]]:
    """A span of the rule's slots holding at least its first slot after ``start``: ``span`` joined to
    it when ``start`` lies a few slots (``_WALL_BRIDGE``) before or after it, else a new one."""
    if span is not None:
        lo, slots = span
        if start < lo:  # walk from start up to the span
            it, before = cr.croniter(fields, start), list[datetime]()
            for _ in range(_WALL_BRIDGE):
                slot = it.get_next(datetime)
                if slot > lo:
                    if slot == slots[0] and len(before) + len(slots) <= _WALL_SPAN_MAX:
                        return start, tuple(before) + slots
                    return start, (*before, slot)
                before.append(slot)
            return start, tuple(before)
        it, after = cr.croniter(fields, slots[-1]), []
        for _ in range(_WALL_BRIDGE):  # walk from the span's end past start
            slot = it.get_next(datetime)
            after.append(slot)
            if slot > start:
                if len(slots) + len(after) <= _WALL_SPAN_MAX:
                    return lo, slots + tuple(after)
                return start, (slot,)
    return start, (cr.croniter(fields, start).get_next(datetime),)


# ---------------------------------------------------------------------------
# RFC 5545 rules (normal form from promptyoself/recurrence.py)

_WEEK = timedelta(days=7)
_CYCLE = timedelta(days=146_097)  # 400 Gregorian years
RULE_HORIZON_YEARS = 200
_LAST_CYCLE_YEAR = 9999 - RULE_HORIZON_YEARS
"""How far ahead a rule's next run is looked for: a rule without a run in that span has ended."""


def rfc5545_to_utc(wall: datetime, tz: ZoneInfo) -> datetime:
    """A wall time of a rule -> its instant, as RFC 5545 says: inside a spring-forward gap the offset
    from before the gap (Berlin 02:30 -> 01:30Z, i.e. 03:30 CEST); a repeated one the first (fold=0)."""
    return wall.replace(tzinfo=tz, fold=0).astimezone(UTC)


@functools.lru_cache(maxsize=1024)
def _rrule_parts(value: str) -> tuple[str, Any, datetime | None]:
    """A normal-form rule read once: the rule without UNTIL, a dateutil rrule of it (for its FREQ,
    INTERVAL and COUNT), and UNTIL as an instant (``UNTIL=...Z``; dateutil would refuse a UTC UNTIL
    with a floating DTSTART, so UNTIL is applied here)."""
    from dateutil import rrule as du

    parts = ";".join(p for p in value.split(";") if not p.startswith("UNTIL="))
    until = next((p[6:] for p in value.split(";") if p.startswith("UNTIL=")), None)
    until_at = datetime.strptime(until, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC) if until else None
    fields = dict(p.split("=", 1) for p in parts.split(";"))  # no BY parts: nothing dateutil could refuse
    shape = du.rrule(getattr(du, fields["FREQ"]), interval=int(fields.get("INTERVAL", "1")),
                     count=int(fields["COUNT"]) if "COUNT" in fields else None, dtstart=datetime(2000, 1, 1))  # noqa: DTZ001
    return parts, shape, until_at


_DAY_LIMITS = ("BYMONTH", "BYMONTHDAY", "BYDAY")


def _hours_minutes(fields: dict[str, str], hour: int, minute: int) -> tuple[list[int], list[int]] | None:
    """The hours and minutes of the day a FREQ=DAILY/WEEKLY (INTERVAL 1), HOURLY (INTERVAL dividing 24)
    or MINUTELY (INTERVAL dividing 60, or whole hours dividing 24) rule runs at, every day alike; None
    for other rules, whose times differ from day to day. ``hour:minute`` is DTSTART's (the phase)."""
    freq, n = fields["FREQ"], int(fields.get("INTERVAL", "1"))
    hours = [int(h) for h in fields["BYHOUR"].split(",")] if "BYHOUR" in fields else list(range(24))
    minutes = [int(m) for m in fields["BYMINUTE"].split(",")] if "BYMINUTE" in fields else list(range(60))
    if freq in ("DAILY", "WEEKLY") and n == 1:
        return hours, minutes
    if freq == "HOURLY" and 24 % n == 0:
        return [h for h in hours if (h - hour) % n == 0], minutes
    if freq == "MINUTELY" and 60 % n == 0:
        return hours, [m for m in minutes if (m - minute) % n == 0]
    if freq == "MINUTELY" and n % 60 == 0 and 1440 % n == 0:
        return [h for h in hours if (h - hour) % (n // 60) == 0], [m for m in minutes if m == minute]
    return None


@functools.lru_cache(maxsize=1024)
def _as_yearly(parts: str, hour: int, minute: int) -> str | None:
    """A rule that names months or days (BYMONTH, BYMONTHDAY; BYDAY below WEEKLY) and runs at the same
    times each day it runs, as the FREQ=YEARLY rule with the same runs (the days all its parts allow, at
    those times; COUNT counts the same runs): dateutil walks it a year at a time, not a day or a minute
    at a time (a rule on 29 February that is a Sunday waits up to 40 years). ``""`` when it has no
    time of day (it never runs); None when it is not such a rule (it is walked as it is)."""
    fields = dict(p.split("=", 1) for p in parts.split(";"))
    freq = fields["FREQ"]
    limited = any(k in fields for k in _DAY_LIMITS[:2]) or ("BYDAY" in fields and freq != "WEEKLY")
    if not limited or freq in ("MONTHLY", "YEARLY") or "BYSETPOS" in fields:
        return None
    times = _hours_minutes(fields, hour, minute)
    if times is None:
        return None
    hours, minutes = times
    if not hours or not minutes:
        return ""
    if "BYMONTHDAY" not in fields and "BYDAY" not in fields:  # (else dateutil takes the day from DTSTART)
        fields["BYDAY"] = "MO,TU,WE,TH,FR,SA,SU"
    out = ["FREQ=YEARLY", *(f"{k}={fields[k]}" for k in _DAY_LIMITS if k in fields),
           f"BYHOUR={','.join(map(str, hours))}", f"BYMINUTE={','.join(map(str, minutes))}", "BYSECOND=0"]
    return ";".join(out + ([f"COUNT={fields['COUNT']}"] if "COUNT" in fields else []))


@functools.lru_cache(maxsize=1024)
def _rrule_at(parts: str, dtstart: datetime) -> Any:
    """The dateutil rrule of ``parts`` from ``dtstart`` (a wall time). dateutil refuses a rule whose
    BY parts its INTERVAL never reaches from that DTSTART (ValueError), as recurrence.py checks."""
    from dateutil import rrule as du

    return du.rrulestr(parts, dtstart=dtstart)


def _rrule_start(rule: Any, dtstart: datetime, since: datetime) -> datetime:
    """A later DTSTART with the same occurrences from there on, a whole number of periods later (so
    INTERVAL keeps its phase), at most a period before ``since``: iteration starts near ``since``,
    not at the schedule's creation. Rules with COUNT count from their own DTSTART, so they keep it.
    Relies on the normal form naming every BY part that dateutil would take from DTSTART."""
    from dateutil import rrule as du

    if rule._count is not None or since <= dtstart:
        return dtstart
    n = rule._interval
    step = {du.WEEKLY: _WEEK, du.DAILY: timedelta(days=1), du.HOURLY: timedelta(hours=1),
            du.MINUTELY: timedelta(minutes=1)}.get(rule._freq)
    if step is not None:
        k = (since - dtstart) // (step * n) - 1
        return dtstart + k * n * step if k > 0 else dtstart
    months = n * (12 if rule._freq == du.YEARLY else 1)
    k = ((since.year - dtstart.year) * 12 + since.month - dtstart.month) // months - 1
    if k <= 0:
        return dtstart
    total = dtstart.month - 1 + k * months
    return datetime(dtstart.year + total // 12, total % 12 + 1, 1)  # noqa: DTZ001 (wall clock)


def _years_later(wall: datetime, years: int) -> datetime:
    """The same wall time ``years`` later (28 February for a 29th); ``datetime.max`` past the year 9999."""
    if wall.year + years > 9999:
        return datetime.max  # noqa: DTZ901 (a wall time, as ``wall``)
    try:
        return wall.replace(year=wall.year + years)
    except ValueError:  # 29 February in a year that has none
        return wall.replace(year=wall.year + years, day=28)


def _cycle_shift(since: datetime) -> timedelta:
    """Whole 400-year cycles that move the wall time ``since`` into the years 9400-9799 (none when it
    is later), so that at least ``RULE_HORIZON_YEARS`` follow it. The Gregorian calendar repeats exactly
    every 400 years (146,097 days, 20,871 weeks: the same dates on the same weekdays), so a rule
    iterated from a DTSTART moved by this much has
    the same occurrences, moved by this much. dateutil ends its walk at the year 9999: a rule that
    never fires (or not for centuries) costs a walk of at most 600 years, not one to 9999."""
    return _CYCLE * max(0, (_LAST_CYCLE_YEAR - since.year) // 400)


def rrule_instants(value: str, tz: ZoneInfo, *, anchor: datetime, after: datetime) -> Any:
    """The rule's occurrences strictly after ``after``, increasing, each instant once (an iterator
    of aware UTC instants; it ends with the rule, or when the next run is more than ``RULE_HORIZON_YEARS``
    after ``after``). ``anchor`` is the rule's DTSTART (an instant; its wall time in ``tz`` counts).
    Wall times map monotonically except just after a gap: a candidate inside it keeps the offset
    from before the gap, so it lands later than the real wall times of the next ``shift``; those
    are read before it is given out. dateutil's walk is bounded whatever the rule (``_cycle_shift``);
    ``recurrence.normalize_rrule`` refuses the rules for which it would still be long (issue 29)."""
    parts, shape, until = _rrule_parts(value)
    after_utc = ensure_aware(after)
    since = after_utc.astimezone(tz).replace(tzinfo=None) - timedelta(days=1)  # offsets differ by < 1 day
    dtstart = ensure_aware(anchor).astimezone(tz).replace(tzinfo=None)
    last, held, hold_until = after_utc, set[datetime](), since  # held: instants waiting for a gap's shift
    horizon = _years_later(since, RULE_HORIZON_YEARS)
    shift = _cycle_shift(since)
    yearly = _as_yearly(parts, dtstart.hour, dtstart.minute)
    if yearly == "":
        return
    if yearly is not None:
        parts, shape = yearly, _rrule_parts(yearly)[1]
    try:
        rule = _rrule_at(parts, _rrule_start(shape, dtstart, since) + shift)
        for moved in rule.xafter(since + shift, inc=True):
            wall = moved - shift
            if wall > horizon:
                return
            if held and wall > hold_until:
                for t in sorted(held):
                    if until is not None and t > until:
                        return
                    if t > last:
                        last = t
                        yield t
                held.clear()
            t = rfc5545_to_utc(wall, tz)
            back = t.astimezone(tz).replace(tzinfo=None)
            if back != wall or held:  # inside a gap (or within the shift after one)
                hold_until = max(hold_until, wall + (back - wall))
                held.add(t)
                continue
            if until is not None and t > until:
                return
            if t > last:
                last = t
                yield t
        for t in sorted(held):
            if t > last and (until is None or t <= until):
                last = t
                yield t
    except (OverflowError, ValueError, IndexError):  # past year 9999 (or dateutil finds no such day): ended
        return


def next_rrule(value: str, tz: ZoneInfo, after: datetime, *, anchor: datetime) -> datetime | None:
    """First occurrence of a normal-form RRULE strictly after ``after``; None when the rule has
    ended (COUNT or UNTIL reached)."""
    return next(iter(rrule_instants(value, tz, anchor=anchor, after=after)), None)


# ---------------------------------------------------------------------------
# intervals and dispatch


def check_in_range(when: datetime, what: str = "Time") -> datetime:
    """``when`` (aware UTC) when it lies within ``FIRST_INSTANT`` .. ``LAST_INSTANT``; else ``out_of_range``."""
    at = ensure_aware(when)
    if FIRST_INSTANT <= at <= LAST_INSTANT:
        return at
    raise OutOfRange(f"{what} {at.isoformat()} is out of range: schedules use instants from "
                     f"{FIRST_INSTANT:%Y-%m-%d} to {LAST_INSTANT:%Y-%m-%d} (UTC), which every timezone can show.")


def interval_slots_fit(start: datetime, every: timedelta) -> None:
    """``out_of_range`` unless an interval schedule's first ``INTERVAL_SLOTS_SHOWN`` runs (``start``,
    ``start + every``, ...: what ``list`` shows) all lie within the range of ``check_in_range``. A
    slot past ``LAST_INSTANT`` is never computed: the schedule ends before it (``next_run_after``)."""
    check_in_range(start, "start_at")
    last = ensure_aware(start).timestamp() + (INTERVAL_SLOTS_SHOWN - 1) * every.total_seconds()
    if last > LAST_INSTANT.timestamp():
        raise OutOfRange(
            f"Every {format_duration(every)} from {ensure_aware(start).isoformat()} leaves the calendar: its "
            f"{INTERVAL_SLOTS_SHOWN}th run would be after {LAST_INSTANT:%Y-%m-%d} (UTC). Start earlier or use "
            "a shorter interval.")


def next_interval_slot(start: datetime, every: timedelta, after: datetime) -> datetime:
    """Smallest ``start + k*every`` (k >= 0) strictly after ``after``; exact, O(1). ``out_of_range``
    (never OverflowError) when that slot is past ``LAST_INSTANT``."""
    if every <= timedelta(0):
        raise InvalidInterval("Interval must be positive, e.g. '5m'.")
    start_utc = ensure_aware(start)
    after_utc = ensure_aware(after)
    if start_utc > after_utc:
        return check_in_range(start_utc, "The next run")
    k = (after_utc - start_utc) // every + 1  # integer microsecond arithmetic
    if (LAST_INSTANT - start_utc) // every < k:  # (the subtraction cannot overflow; start + k*every could)
        raise OutOfRange(f"The next run of every {format_duration(every)} from {start_utc.isoformat()} after "
                         f"{after_utc.isoformat()} is past {LAST_INSTANT:%Y-%m-%d}: the schedule has no more runs.")
    return check_in_range(start_utc + k * every, "The next run")


def next_run_after(
    schedule_type: str,
    schedule_value: str,
    tz: ZoneInfo,
    *,
    after: datetime,
    anchor: datetime | None = None,
) -> datetime | None:
    """Next run strictly after ``after``: None for 'once' and for an RFC 5545 rule that has ended
    (COUNT, UNTIL); cron; RFC 5545 ('rrule', from its DTSTART ``anchor``); fixed-rate interval."""
    if schedule_type == "once":
        return None
    if schedule_type == "cron":
        return next_cron(schedule_value, tz, after)
    if schedule_type == "rrule":
        if anchor is None:
            raise InvalidArgument("An RRULE schedule needs its start (anchor, DTSTART) for the next run.")
        return next_rrule(schedule_value, tz, after, anchor=anchor)
    if schedule_type == "interval":
        if anchor is None:
            raise InvalidArgument("An interval schedule needs its start time (anchor) for the next run.")
        try:
            return next_interval_slot(anchor, parse_interval(schedule_value), after)
        except OutOfRange:  # the calendar ends before its next slot: so does the schedule
            return None
    raise InvalidArgument(f"Unknown schedule type {schedule_type!r}; use 'once', 'cron', 'rrule' or 'interval'.")


def day_start(now: datetime, tz: ZoneInfo) -> datetime:
    """The instant (UTC) the day of ``now`` began in ``tz``: where daily delivery budgets reset."""
    local = ensure_aware(now).astimezone(tz)
    return local_to_utc(datetime(local.year, local.month, local.day), tz)  # noqa: DTZ001 (wall clock in tz)
