"""What people and agents write for a one-time instant -> an aware UTC instant. Pure: ``now`` is a
parameter, nothing reads the clock.

The forms, tried in this order (docs/promptyoself-tools.md lists them for users):

1. A zone written at the end (``... Europe/Berlin``, ``...[Europe/Berlin]``, ``... UTC``, in any
   case) is taken off first: the rest is read in that zone, and it becomes the schedule's timezone
   (``When.zone``). Otherwise the rest is read in the ``tz`` given (the timezone argument).
2. Relative: ``in 5m``, ``+2h``, ``in 1h30m``, ``in 90 minutes``, ``in 3 days``, ``in an hour``:
   ``now`` plus that exact duration.
3. The natural grammar below (``_read_natural``).
4. ISO 8601 (``2026-12-25T09:00:00+01:00``; naive ``2026-12-25 09:00`` in the zone) and complete
   dates python-dateutil reads (``Dec 25 2026 10am``): the year, month and day must all be written.

The natural grammar, deterministic and small: ``[DAY] [at] TIME``, ``[at] TIME [on] DAY``, or
``[at] TIME`` alone, where

* TIME is ``9am``, ``9:30pm``, ``12am`` (00:00), ``12pm`` (12:00), ``17:30``, ``17:30:15``, ``noon``,
  ``midday``, ``midnight``, or an hour alone after ``at`` or after a DAY (``at 9``, ``tomorrow 9``).
  Without am/pm an hour is on the 24-hour clock (``9`` is 09:00, ``21`` is 21:00).
* DAY is ``today``, ``tomorrow``, a weekday (``monday``, ``mon``, ``next monday``), a month and day
  (``Dec 25``, ``December 25th``, ``25 December``, ``25th of Dec``) with an optional year, or
  ``2027-01-15``.

Rules: a TIME alone is its next occurrence (today if still ahead, else tomorrow); a weekday is its
next occurrence after today (``next monday`` is the same day; on a Monday both mean in 7 days); a
month and day without a year is the next time that date comes round; ``today`` stays today (a time
already past is ``time_in_past``). A DAY needs a TIME, except a date with its year (read as 00:00 by
form 4). ``midnight`` alone is the next 00:00; after a DAY it is ambiguous (which end of the day?)
and refused. A wall time inside a DST gap is the first instant after the gap, a repeated one the
first occurrence (``timing.local_to_utc``). Anything else is ``invalid_time`` listing these forms.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo

from promptyoself.errors import InvalidArgument, InvalidTime, PromptYoSelfError, TimeInPast
from promptyoself.timing import (
    _US,
    _UTC_NAMES,
    _compound_us,
    _is_naive,
    _rule_text,
    _zone_suggestion,
    abbreviation_advice,
    check_in_range,
    ensure_aware,
    local_to_utc,
    resolve_zone,
    to_utc_iso,
)

__all__ = ["MONTHS", "TIME_FORMS", "WEEKDAYS", "When", "clock_time", "ensure_future", "parse_time", "read_time"]

MAX_RELATIVE = timedelta(days=36525)  # ~100 years; far from datetime.max

TIME_FORMS = (
    "Accepted forms: 'tomorrow at 9am', 'tomorrow 9', 'today 17:30', 'at 18:00', '9pm', 'noon', "
    "'midnight', 'monday 9:00', 'next friday at 14:30', 'Dec 25 at 9', '25 December 2027 09:00', "
    "'2027-01-15 9am'; relative 'in 5m', 'in 2 hours', 'in 3 days', '+2h'; ISO 8601 with offset "
    "('2026-12-25T10:00:00-05:00', '...Z'); a local date-time read in the timezone argument "
    "('2026-12-25 10:00'), or with its zone ('2026-12-25 10:00 Europe/Berlin', '... UTC'). Hours "
    "without am/pm are 24-hour."
)

WEEKDAYS: dict[str, int] = {}
for _i, _names in enumerate((("monday", "mon"), ("tuesday", "tue", "tues"), ("wednesday", "wed"),
                             ("thursday", "thu", "thur", "thurs"), ("friday", "fri"),
                             ("saturday", "sat"), ("sunday", "sun"))):
    WEEKDAYS.update(dict.fromkeys(_names, _i))
MONTHS: dict[str, int] = {}
for _i, _names in enumerate((("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"),
                             ("may",), ("june", "jun"), ("july", "jul"), ("august", "aug"),
                             ("september", "sep", "sept"), ("october", "oct"), ("november", "nov"),
                             ("december", "dec")), start=1):
    MONTHS.update(dict.fromkeys(_names, _i))


def _alternatives(words: dict[str, int]) -> str:
    return "(?:" + "|".join(sorted(words, key=len, reverse=True)) + ")"


_WD, _MON = _alternatives(WEEKDAYS), _alternatives(MONTHS)
CLOCK = (r"(?:(?P<word>noon|midday|midnight)|(?P<h>\d{1,2})(?::(?P<m>\d{2})(?::(?P<s>\d{2}))?)?"
         r"\s*(?P<ampm>[ap]\.?m\.?)?)")
"""A time of day (named groups word, h, m, s, ampm); ``clock_time`` reads a match."""
_DAY = (rf"(?:(?P<rel>today|tomorrow|yesterday)|(?:(?P<next>next|this)\s+)?(?P<wd>{_WD})"
        rf"|(?P<mon1>{_MON})\.?\s+(?P<d1>\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s+(?P<y1>\d{{4}}))?"
        rf"|(?P<d2>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<mon2>{_MON})\.?(?:,?\s+(?P<y2>\d{{4}}))?"
        r"|(?P<iso>\d{4}-\d{2}-\d{2}))")
_AT = r"(?:(?P<at>at|@)\s*)?"
_TIME_ONLY = re.compile(rf"{_AT}{CLOCK}")
_DAY_TIME = re.compile(rf"(?:on\s+)?{_DAY}(?:\s*,?\s*{_AT}{CLOCK})?")
_TIME_DAY = re.compile(rf"{_AT}{CLOCK},?\s+(?:on\s+)?{_DAY}")
_RELATIVE_RE = re.compile(r"(?:in\s+|\+\s*)(?P<body>.+?)(?:\s+from\s+now)?")
_BRACKET_ZONE_RE = re.compile(r"(?P<body>.+?)\s*\[(?P<zone>[^\]]+)\]")
_SUFFIX_ZONE_RE = re.compile(r"(?P<body>.+?)\s+(?P<zone>[A-Za-z_]+(?:/[A-Za-z0-9_+\-]+)+|utc|gmt|z)", re.I)


@dataclass(frozen=True)
class When:
    """A parsed one-time instant, and the zone written in the text (None: none was written)."""

    instant: datetime
    zone: ZoneInfo | None = None


def clock_time(m: re.Match[str], shown: str) -> time:
    """The time of day of a ``CLOCK`` match; ``invalid_time`` for 25:00, 13pm, 9:75."""
    word = m.group("word")
    if word:
        return time(0) if word == "midnight" else time(12)
    hour, minute, second = int(m.group("h")), int(m.group("m") or 0), int(m.group("s") or 0)
    ampm = (m.group("ampm") or "").replace(".", "")
    if ampm:
        if not 1 <= hour <= 12:
            raise InvalidTime(f"{shown!r}: with am/pm the hour is 1 to 12. {TIME_FORMS}")
        hour = hour % 12 + (12 if ampm == "pm" else 0)
    if hour > 23 or minute > 59 or second > 59:
        raise InvalidTime(f"{shown!r} has no such time of day (hours 0-23, minutes 0-59). {TIME_FORMS}")
    return time(hour, minute, second)


# ---- the natural grammar ------------------------------------------------------------------------


def _date(year: int, month: int, day: int, shown: str) -> date:
    try:
        return date(year, month, day)
    except ValueError:
        raise InvalidTime(f"{shown!r}: {year:04d}-{month:02d}-{day:02d} is not a date. {TIME_FORMS}") from None


def _read_natural(body: str, shown: str, now: datetime, zone: ZoneInfo) -> datetime | None:
    """The natural grammar (module docstring); None when ``body`` is not in it."""
    local = now.astimezone(zone)
    today = local.date()

    def at(day: date, clock: time) -> datetime:
        try:
            return local_to_utc(datetime.combine(day, clock), zone)
        except (OverflowError, ValueError):
            raise InvalidTime(f"Time {shown!r} is out of range. {TIME_FORMS}") from None

    m = _TIME_ONLY.fullmatch(body)
    if m:
        if not (m.group("at") or m.group("m") or m.group("ampm") or m.group("word")):
            raise InvalidTime(f"{shown!r} is ambiguous: write 'at {body}' (24-hour clock), "
                              f"'{body}am'/'{body}pm', or 'in {body}m'. {TIME_FORMS}")
        clock = clock_time(m, shown)
        first = at(today, clock)
        return first if first > now else at(today + timedelta(days=1), clock)
    m = _DAY_TIME.fullmatch(body) or _TIME_DAY.fullmatch(body)
    if m is None:
        return None
    year = m.group("y1") or m.group("y2")
    if m.group("h") is None and m.group("word") is None:
        if year or m.group("iso"):
            return None  # a full date without a time: 00:00 (form 4)
        raise InvalidTime(f"{shown!r} names a day but not the time: add it, e.g. '{body} at 9am'. {TIME_FORMS}")
    if m.group("word") == "midnight":
        raise InvalidTime(f"{shown!r} is ambiguous (the start or the end of that day?): write "
                          f"'{body.replace('midnight', '00:00')}' or '... 23:59'. {TIME_FORMS}")
    clock = clock_time(m, shown)
    if m.group("rel"):
        return at(today + timedelta(days={"tomorrow": 1, "today": 0, "yesterday": -1}[m.group("rel")]), clock)
    if m.group("wd"):
        ahead = (WEEKDAYS[m.group("wd")] - today.weekday()) % 7 or 7
        return at(today + timedelta(days=ahead), clock)
    if m.group("iso"):
        y, mo, d = (int(x) for x in m.group("iso").split("-"))
        return at(_date(y, mo, d, shown), clock)
    month = MONTHS[m.group("mon1") or m.group("mon2")]
    day = int(m.group("d1") or m.group("d2"))
    if year:
        return at(_date(int(year), month, day, shown), clock)
    for y in range(today.year, today.year + 9):  # the next time it comes round (Feb 29: a leap year)
        try:
            candidate = at(date(y, month, day), clock)
        except ValueError:
            continue
        if candidate > now:
            return candidate
    raise InvalidTime(f"{shown!r}: there is no such date. {TIME_FORMS}")


# ---- formal forms (ISO 8601, dateutil, relative) --------------------------------------------------


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
        raise InvalidTime(f"Time {shown!r} is out of range. {TIME_FORMS}") from None


def _parse_relative(body: str, shown: str, now_utc: datetime) -> datetime:
    body = re.sub(r"\ban?\s+", "1 ", body)  # "in an hour"
    body = re.sub(r"\s+and\s+", " ", body)  # "in 1 hour and 30 minutes"
    total_us = _compound_us(body)
    if total_us is None:
        raise InvalidTime(f"Cannot read relative time {shown!r}. {TIME_FORMS}")
    if total_us > MAX_RELATIVE // _US:
        raise InvalidTime(f"Relative time {shown!r} is more than 100 years ahead; give a nearer time.")
    return now_utc + timedelta(microseconds=total_us)


def read_time(text: str, *, now: datetime, tz: ZoneInfo) -> When:
    """Parse a one-time instant (the forms of the module docstring). Does not check that it is
    in the future (``ensure_future``); one past the instants every zone can show is ``out_of_range``
    (``timing.check_in_range``)."""
    read = _read_time(text, now=now, tz=tz)
    check_in_range(read.instant)
    return read


def _read_time(text: str, *, now: datetime, tz: ZoneInfo) -> When:
    shown = _rule_text(text, "Time", InvalidTime, TIME_FORMS).strip()
    if not shown:
        raise InvalidTime(f"Time is empty. {TIME_FORMS}")
    now_utc = ensure_aware(now)
    written: ZoneInfo | None = None
    body = shown
    zm = _BRACKET_ZONE_RE.fullmatch(shown) or _SUFFIX_ZONE_RE.fullmatch(shown)
    if zm:
        try:
            written = resolve_zone(zm.group("zone"))
        except InvalidArgument as exc:
            raise InvalidTime(f"{exc.message} (in time {shown!r})") from None
        body = zm.group("body").strip()
    else:
        rest, _, last = shown.rpartition(" ")
        abbreviation = abbreviation_advice(last) if rest.strip() else None
        if abbreviation is not None:  # as the timezone argument says of it
            raise InvalidTime(f"{abbreviation} (in time {shown!r})")
    zone = written or tz
    lowered = " ".join(body.lower().split()).rstrip(".")
    if lowered == "now":
        raise InvalidTime("'now' cannot be scheduled; give a future time such as 'in 1m' or 'in 30s'.")
    rel = _RELATIVE_RE.fullmatch(lowered)
    if rel:
        return When(_parse_relative(rel.group("body"), shown, now_utc), written)
    if lowered.startswith("-"):
        raise InvalidTime(f"Time {shown!r} is negative; give a future time ('in 5m').")
    natural = _read_natural(lowered, shown, now_utc, zone)
    if natural is not None:
        return When(natural, written)
    try:
        return When(_to_instant(datetime.fromisoformat(body), zone, shown), written)
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
        hint = _zone_hint(body, now=now_utc, tz=zone)
        raise InvalidTime(f"Cannot read time {shown!r}.{hint} {TIME_FORMS}")
    return When(_to_instant(parsed, zone, shown), written)


def _zone_hint(body: str, *, now: datetime, tz: ZoneInfo) -> str:
    """' A zone goes last as its IANA name. Did you mean ...?' when the last word of an unreadable
    time is zone-like: what comes before it is a time ('tomorrow 9am Berlin'). Not for a word that is
    all there is ('christmas' is not 'Indian/Christmas')."""
    rest, _, last = body.rpartition(" ")
    if not rest.strip() or not last.isalpha() or len(last) < 3:
        return ""
    try:
        _read_time(rest, now=now, tz=tz)
    except PromptYoSelfError:
        return ""
    found = _zone_suggestion(last)
    return f" A zone goes last as its IANA name.{found}" if found else ""


def parse_time(text: str, *, now: datetime, tz: ZoneInfo) -> datetime:
    """``read_time``'s instant alone (aware UTC)."""
    return read_time(text, now=now, tz=tz).instant


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
