"""Recurring rules as people and agents write them -> a stored rule; and every rule in words and as
its next runs. Pure: ``now`` is a parameter.

The ``cron`` argument takes three kinds of rule (``parse_rule``):

* 5-field cron and the @-aliases (``timing.normalize_cron``): stored as ``cron``.
* RFC 5545 RRULE (``FREQ=MONTHLY;BYDAY=-1FR;BYHOUR=17;BYMINUTE=0``, optionally ``RRULE:`` first):
  stored as ``rrule`` in its normal form (``normalize_rrule``), iterated by python-dateutil's rrule
  (``timing.next_rrule``). Its DTSTART is the first whole minute after the schedule is made, kept
  in the schedule's ``anchor``: COUNT counts from there, INTERVAL keeps that phase, and the parts
  the rule leaves out are taken from it (RFC 5545) and written into the normal form, seconds 0.
* Natural recurrence (``natural_rule``): ``every weekday at 9``, ``every day at 7:30``, ``every
  monday at 10``, ``every 2 weeks on tuesday and thursday at 10:00``, ``last friday of every month
  at 17:00``, ``first monday of the month at 9``, ... compiled to an RRULE and stored like one.

DST for RRULEs is RFC 5545's (``timing.rfc5545_to_utc``): a local time that does not exist takes
the offset from before the gap; a repeated one is the first occurrence.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from promptyoself import timing
from promptyoself.errors import InvalidCron, InvalidTime, PromptYoSelfError
from promptyoself.phrases import CLOCK, MONTHS, WEEKDAYS, clock_time

__all__ = ["MAX_RULE_CHARS", "RULE_FORMS", "Rule", "describe", "natural_rule", "normalize_rrule",
           "parse_rule", "upcoming"]

MAX_RULE_CHARS = 300  # schedule_value holds 300 (migration 0008)
MAX_COUNT = 1000
MAX_INTERVAL = 1000
_MAX_INTERVALS = {"YEARLY": 100}  # one period within timing.RULE_HORIZON_YEARS
MAX_UNTIL_YEARS = 100
_SAME_TIMES_EVERY_DAY = {"HOURLY": (1, 2, 3, 4, 6, 8, 12, 24),  # (see timing._hours_minutes)
                         "MINUTELY": (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60, 120, 180, 240, 360, 480, 720, 1440)}
UPCOMING = 5

RULE_FORMS = (
    "Accepted: 5-field cron ('0 9 * * MON-FRI', '@daily'); RFC 5545 RRULE "
    "('FREQ=MONTHLY;BYDAY=-1FR;BYHOUR=17;BYMINUTE=0', 'FREQ=WEEKLY;INTERVAL=2;BYDAY=TU,TH;BYHOUR=10;"
    "BYMINUTE=0;COUNT=6'); or words: 'every weekday at 9', 'every day at 7:30', 'every monday at 10', "
    "'every 2 weeks on tuesday and thursday at 10:00', 'last friday of every month at 17:00', "
    "'first monday of the month at 9', 'every month on the 15th at 9', 'every year on Dec 25 at 9', "
    "'every 2 hours', 'every 30 minutes'; add ', 5 times' or ' until 2027-06-30'."
)

_FREQS = ("MINUTELY", "HOURLY", "DAILY", "WEEKLY", "MONTHLY", "YEARLY")
_DAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
_DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTH_NAMES = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
                "October", "November", "December")
_ORDER = ("FREQ", "INTERVAL", "WKST", "BYMONTH", "BYMONTHDAY", "BYDAY", "BYSETPOS", "BYHOUR", "BYMINUTE",
          "BYSECOND", "COUNT", "UNTIL")
_NUMBER_LISTS = {"BYMONTH": (1, 12, False), "BYMONTHDAY": (1, 31, True), "BYHOUR": (0, 23, False),
                 "BYMINUTE": (0, 59, False), "BYSECOND": (0, 0, False), "BYSETPOS": (1, 366, True)}
_BYDAY_RE = re.compile(r"([+-]?\d{1,2})?(MO|TU|WE|TH|FR|SA|SU)")
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


@dataclass(frozen=True)
class Rule:
    """A recurring rule read from the ``cron`` argument: what to store and its first run."""

    schedule_type: str  # cron | rrule
    value: str
    anchor: datetime | None  # an RRULE's DTSTART
    first: datetime


def _bad(message: str) -> InvalidCron:
    return InvalidCron(f"{message} {RULE_FORMS}")


# ---- RFC 5545 -----------------------------------------------------------------------------------


def _numbers(key: str, text: str) -> list[int]:
    low, high, signed = _NUMBER_LISTS[key]
    out: list[int] = []
    for item in text.split(","):
        try:
            n = int(item)
        except ValueError:
            raise _bad(f"RRULE {key}={text}: {item!r} is not a number.") from None
        if not (low <= abs(n) <= high and (signed or n >= 0)) or (signed and n == 0):
            limits = f"{'±' if signed else ''}{low} to {high}"
            raise _bad(f"RRULE {key}={text}: {n} is out of range ({limits})."
                       + (" Seconds are not supported: use BYSECOND=0." if key == "BYSECOND" else ""))
        if n not in out:
            out.append(n)
    return sorted(out)


def _bydays(text: str, freq: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for item in text.split(","):
        m = _BYDAY_RE.fullmatch(item)
        if m is None:
            raise _bad(f"RRULE BYDAY={text}: {item!r} is not a weekday such as MO, -1FR or 2TU.")
        n = int(m.group(1) or 0)
        limit = {"MONTHLY": 5, "YEARLY": 53}.get(freq, 0)
        if n and not 1 <= abs(n) <= limit:
            raise _bad(f"RRULE BYDAY={text}: {item} is out of range"
                       + (f" (±1 to {limit})." if limit else "; a numbered weekday needs FREQ=MONTHLY or YEARLY."))
        if (n, _DAYS.index(m.group(2))) not in out:
            out.append((n, _DAYS.index(m.group(2))))
    return sorted(out, key=lambda p: (p[1], p[0]))


def _until(text: str, tz: ZoneInfo) -> datetime:
    """UNTIL -> an instant: ``...Z`` is UTC, a local date-time is read in ``tz``, a date is the end
    of that day in ``tz``."""
    try:
        if re.fullmatch(r"\d{8}T\d{6}Z", text):
            return datetime.strptime(text, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        if re.fullmatch(r"\d{8}T\d{6}", text):
            return timing.rfc5545_to_utc(datetime.strptime(text, "%Y%m%dT%H%M%S"), tz)  # noqa: DTZ007
        if re.fullmatch(r"\d{8}", text):
            day = datetime.strptime(text, "%Y%m%d")  # noqa: DTZ007 (a wall-clock date)
            return timing.rfc5545_to_utc(day.replace(hour=23, minute=59, second=59), tz)
    except (ValueError, OverflowError):
        pass
    raise _bad(f"RRULE UNTIL={text} is not a date (20271231), a local time (20271231T170000) or UTC "
               "(20271231T170000Z).")


def _fits(months: list[int], monthdays: list[int]) -> bool:
    """Whether some month of ``months`` (all if empty) has one of ``monthdays`` (all if empty)."""
    return not monthdays or any(abs(d) <= _MONTH_DAYS[m - 1] for m in months or range(1, 13) for d in monthdays)


def _dtstart(now: datetime, tz: ZoneInfo) -> datetime:
    """The DTSTART of a rule made at ``now``: the first whole minute after it (an instant)."""
    now_utc = timing.ensure_aware(now)
    return now_utc.replace(second=0, microsecond=0) + timedelta(minutes=1)


@dataclass
class _Parts:
    """An RRULE read part by part (``_read``) and completed from its DTSTART (``_complete``)."""

    given: dict[str, str]  # the parts as written, upper case
    freq: str
    interval: int = 1
    count: int | None = None
    wkst: str = "MO"
    nums: dict[str, list[int]] = field(default_factory=dict)  # the number lists (_NUMBER_LISTS)
    days: list[tuple[int, int]] = field(default_factory=list)  # BYDAY: (ordinal or 0, weekday)
    until: datetime | None = None

    def limits_days(self) -> bool:
        """Whether the rule picks months or days of the month (BYMONTH, BYMONTHDAY)."""
        return "BYMONTH" in self.nums or "BYMONTHDAY" in self.nums


def _split(text: str) -> dict[str, str]:
    """``FREQ=...;KEY=VALUE;...`` (``RRULE:`` first or not) -> its parts, upper case, each once."""
    body = text.strip()
    if body.upper().startswith("RRULE:"):
        body = body[6:]
    parts: dict[str, str] = {}
    for item in body.upper().replace(" ", "").strip(";").split(";"):
        key, eq, value = item.partition("=")
        if not eq or not value:
            raise _bad(f"RRULE part {item!r} is not KEY=VALUE.")
        if key not in _ORDER:
            raise _bad(f"RRULE part {key} is not supported (supported: {', '.join(_ORDER)}).")
        if key in parts:
            raise _bad(f"RRULE part {key} is given twice.")
        parts[key] = value
    return parts


def _whole(key: str, text: str, limit: int) -> int:
    if not text.isdigit() or not 1 <= int(text) <= limit:
        raise _bad(f"RRULE {key}={text} must be a whole number from 1 to {limit}.")
    return int(text)


def _read(text: str, tz: ZoneInfo) -> _Parts:
    """Each part checked on its own: its values, ranges and spelling."""
    given = _split(text)
    freq = given.get("FREQ", "")
    if freq not in _FREQS:
        raise _bad(f"RRULE FREQ must be one of {', '.join(_FREQS)}" + (f", not {freq}." if freq else "."))
    p = _Parts(given, freq)
    if "INTERVAL" in given:
        p.interval = _whole("INTERVAL", given["INTERVAL"], _MAX_INTERVALS.get(freq, MAX_INTERVAL))
    if "COUNT" in given:
        p.count = _whole("COUNT", given["COUNT"], MAX_COUNT)
    p.wkst = given.get("WKST", "MO")
    if p.wkst not in _DAYS:
        raise _bad(f"RRULE WKST={p.wkst} is not a weekday (MO ... SU).")
    p.nums = {key: _numbers(key, given[key]) for key in _NUMBER_LISTS if key in given}
    p.days = _bydays(given["BYDAY"], freq) if "BYDAY" in given else []
    p.until = _until(given["UNTIL"], tz) if "UNTIL" in given else None
    return p


def _complete(p: _Parts, start: datetime) -> None:
    """Write out the parts RFC 5545 takes from DTSTART (``start``, local), so that the rule means the
    same from whatever DTSTART it is iterated (see _rrule_start in timing.py); seconds are 0."""
    level = _FREQS.index(p.freq)
    p.nums.setdefault("BYSECOND", [0])
    if level >= _FREQS.index("HOURLY"):
        p.nums.setdefault("BYMINUTE", [start.minute])
    if level >= _FREQS.index("DAILY"):
        p.nums.setdefault("BYHOUR", [start.hour])
    if p.freq == "WEEKLY" and not p.days:
        p.days = [(0, start.weekday())]
    if p.freq in ("MONTHLY", "YEARLY") and not p.days and "BYMONTHDAY" not in p.nums:
        p.nums["BYMONTHDAY"] = [start.day]
        if p.freq == "YEARLY":
            p.nums.setdefault("BYMONTH", [start.month])


# ---- what the parts mean together: each check returns why the rule is refused, or None ----------
# A rule that never fires, or whose runs drift so that it may go centuries without one, is refused
# here: iterating it would walk the calendar to the year 9999 (issue 29; timing.rrule_instants).


def _both_ends(p: _Parts, start: datetime) -> str | None:
    return "RRULE takes COUNT or UNTIL, not both." if p.count is not None and p.until is not None else None


def _until_too_far(p: _Parts, start: datetime) -> str | None:
    if p.until is not None and p.until - start > timedelta(days=365.25 * MAX_UNTIL_YEARS):
        return f"RRULE UNTIL is more than {MAX_UNTIL_YEARS} years ahead; leave it out for a rule without an end."
    return None


def _setpos_alone(p: _Parts, start: datetime) -> str | None:
    if "BYSETPOS" in p.nums and (p.freq not in ("WEEKLY", "MONTHLY", "YEARLY") or len(p.given) <= 2):
        return "RRULE BYSETPOS needs FREQ=WEEKLY, MONTHLY or YEARLY and another BY part."
    return None


def _setpos_with_day_limits(p: _Parts, start: datetime) -> str | None:
    if "BYSETPOS" in p.nums and ("BYMONTHDAY" in p.given or (p.freq == "WEEKLY" and "BYMONTH" in p.given)):
        return ("RRULE BYSETPOS cannot be combined with BYMONTHDAY (nor, weekly, with BYMONTH): how many runs a "
                "period has would change from one to the next. Pick the days with BYDAY.")
    return None


def _mixed_weekdays(p: _Parts, start: datetime) -> str | None:
    numbered = {bool(n) for n, _ in p.days}
    if len(numbered) == 2:
        return ("RRULE BYDAY mixes numbered (1FR, -1MO) and plain (MO) weekdays, which would mean days that are "
                "both. Use one kind, or two schedules.")
    return None


def _no_such_day(p: _Parts, start: datetime) -> str | None:
    if not _fits(p.nums.get("BYMONTH", []), p.nums.get("BYMONTHDAY", [])):
        return "This RRULE never fires: no month it names has that day."
    return None


def _numbered_days_fit(p: _Parts, start: datetime) -> str | None:
    """A weekday numbered within a month (FREQ=MONTHLY, or YEARLY with BYMONTH) is one of its 1st-7th,
    ..., 29th-31st days: BYMONTHDAY must name one of them, in some month the rule names."""
    ordinals = [k for k, _ in p.days if k]
    if not ordinals or not (p.freq == "MONTHLY" or "BYMONTH" in p.nums):
        return None
    if any(abs(k) > 5 for k in ordinals):
        return "This RRULE never fires: a month has at most 5 of each weekday (BYDAY 1MO to 5MO, -1MO to -5MO)."
    if "BYMONTHDAY" not in p.given:
        return None
    months = p.nums.get("BYMONTH") or list(range(1, 13))
    lengths = {_MONTH_DAYS[m - 1] for m in months} | ({28} if 2 in months else set())
    for length in lengths:
        days = {d if d > 0 else length + 1 + d for d in p.nums["BYMONTHDAY"] if abs(d) <= length}
        for k in ordinals:
            first = 7 * (k - 1) + 1 if k > 0 else length + 7 * k + 1
            if any(first <= d < first + 7 for d in days):
                return None
    return "This RRULE never fires: no day BYMONTHDAY names can be the numbered weekday BYDAY names."


def _runs_per_period(p: _Parts) -> int:
    """The most runs one period (week, month, year) can have: what BYSETPOS picks from."""
    plain = sum(1 for n, _ in p.days if not n)
    numbered = len(p.days) - plain
    months = len(p.nums.get("BYMONTH", [])) or 12
    monthdays = len(p.nums.get("BYMONTHDAY", []))
    if p.freq == "WEEKLY":
        dates = plain
    elif p.freq == "MONTHLY":
        dates = plain * 5 + numbered or monthdays
    elif "BYMONTH" in p.nums:
        dates = (plain * 5 + numbered or monthdays) * months
    else:
        dates = plain * 53 + numbered or monthdays * 12
    return dates * len(p.nums.get("BYHOUR", [0])) * len(p.nums.get("BYMINUTE", [0]))


def _setpos_beyond(p: _Parts, start: datetime) -> str | None:
    if "BYSETPOS" in p.nums and max(abs(x) for x in p.nums["BYSETPOS"]) > _runs_per_period(p):
        return "This RRULE never fires: BYSETPOS is beyond the runs of one period."
    return None


def _drifting_times(p: _Parts, start: datetime) -> str | None:
    n = p.interval
    same_times = n in _SAME_TIMES_EVERY_DAY.get(p.freq, (n,))
    if not same_times and (p.days or p.limits_days()):
        steps = ", ".join(map(str, _SAME_TIMES_EVERY_DAY[p.freq]))
        return (f"With BYMONTH, BYMONTHDAY or BYDAY, a FREQ={p.freq} rule takes INTERVAL {steps} (the same times "
                f"every day); with {n} its times drift from day to day, and the days it names may go centuries "
                "without one.")
    return None


def _drifting_days(p: _Parts, start: datetime) -> str | None:
    if p.freq in ("DAILY", "WEEKLY") and p.interval > 1 and p.limits_days():
        return (f"A FREQ={p.freq} rule with BYMONTH or BYMONTHDAY takes no INTERVAL: its days would drift through "
                "the months (use FREQ=MONTHLY or YEARLY, or leave INTERVAL out).")
    if p.freq == "DAILY" and p.interval % 7 == 0 and p.days and start.weekday() not in {d for _, d in p.days}:
        return (f"This RRULE never fires: every {p.interval} days from now is a {_DAY_NAMES[start.weekday()]}, "
                "which BYDAY leaves out.")
    return None


def _months_never_reached(p: _Parts, start: datetime) -> str | None:
    step = math.gcd(p.interval, 12)
    if p.freq == "MONTHLY" and "BYMONTH" in p.nums and all((m - start.month) % step for m in p.nums["BYMONTH"]):
        return (f"This RRULE never fires: every {p.interval} months from {_MONTH_NAMES[start.month - 1]} never "
                "reaches the months BYMONTH names.")
    return None


_CHECKS: tuple[Callable[[_Parts, datetime], str | None], ...] = (
    _both_ends, _until_too_far, _setpos_alone, _setpos_with_day_limits, _mixed_weekdays, _no_such_day,
    _numbered_days_fit, _setpos_beyond, _drifting_times, _drifting_days, _months_never_reached,
)


def _written(p: _Parts) -> str:
    """The normal form: the parts in ``_ORDER``, lists sorted, UNTIL in UTC; INTERVAL=1 and WKST=MO
    left out."""
    out: dict[str, str] = {"FREQ": p.freq}
    if p.interval > 1:
        out["INTERVAL"] = str(p.interval)
    if p.wkst != "MO":
        out["WKST"] = p.wkst
    out.update({key: ",".join(str(n) for n in values) for key, values in p.nums.items()})
    if p.days:
        out["BYDAY"] = ",".join(f"{n or ''}{_DAYS[d]}" for n, d in p.days)
    if p.count is not None:
        out["COUNT"] = str(p.count)
    if p.until is not None:
        out["UNTIL"] = p.until.strftime("%Y%m%dT%H%M%SZ")
    return ";".join(f"{k}={out[k]}" for k in _ORDER if k in out)


def normalize_rrule(text: str, *, now: datetime, tz: ZoneInfo) -> tuple[str, datetime]:
    """An RRULE -> (its normal form, its DTSTART). The normal form has its parts in one order, upper
    case, lists sorted, UNTIL in UTC, and names every part dateutil would otherwise take from DTSTART
    (so the rule means the same whatever DTSTART it is iterated from). ``invalid_cron`` says what is
    wrong: a part (``_read``), or the parts together (``_CHECKS``), e.g. a rule that never fires."""
    p = _read(text, tz)
    dtstart = _dtstart(now, tz)
    start = dtstart.astimezone(tz)
    _complete(p, start)
    for check in _CHECKS:
        problem = check(p, start)
        if problem is not None:
            raise _bad(problem)
    value = _written(p)
    if len(value) > MAX_RULE_CHARS:
        raise _bad(f"The rule is longer than {MAX_RULE_CHARS} characters written out ({value[:60]}...).")
    return value, dtstart


# ---- natural recurrence -------------------------------------------------------------------------

_WD = "(?:" + "|".join(sorted(WEEKDAYS, key=len, reverse=True)) + ")"
_MON = "(?:" + "|".join(sorted(MONTHS, key=len, reverse=True)) + ")"
_WDLIST = rf"{_WD}s?(?:\s*(?:,|and|&|,\s*and)\s*{_WD}s?)*"
_WDPLURAL = rf"{_WD}s(?:\s*(?:,|and|&|,\s*and)\s*{_WD}s)*"  # 'mondays at 10', 'mondays and fridays at 9'
_ORDINALS = {"first": 1, "1st": 1, "second": 2, "2nd": 2, "third": 3, "3rd": 3, "fourth": 4, "4th": 4,
             "fifth": 5, "5th": 5, "last": -1, "second to last": -2}
_ORD = "(?:" + "|".join(sorted(_ORDINALS, key=len, reverse=True)) + ")"
_EVERY_MONTH = r"(?:every|each|the|a)\s+month"
_AT = r"(?:\s+at|\s+@|,)?\s+"
_TAIL = re.compile(r"(?P<body>.+?)(?:,?\s+(?:for\s+)?(?P<count>\d+)\s+times"
                   r"|,?\s+until\s+(?P<until>\d{4}-\d{2}-\d{2}))?")
_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((name, re.compile(pattern)) for name, pattern in (
    ("daily", r"(?:every|each)\s+day|daily"),
    ("days", r"every\s+(?P<n>\d+)\s+days"),
    ("weekdays", r"(?:every|each|on)\s+weekdays?|weekdays"),
    ("weekends", r"(?:every|each|on)\s+weekends?(?:\s+days?)?|weekends"),
    ("weekly", rf"(?:(?:every|each)\s+(?:(?P<n>\d+)\s+weeks|(?P<other>other)\s+week|week)\s+on\s+|(?:every|each|on)\s+"
               rf"|weekly\s+on\s+)(?P<days>{_WDLIST})|(?P<plural>{_WDPLURAL})"),
    ("nth", rf"(?:on\s+)?(?:the\s+)?(?P<ord>{_ORD})\s+(?P<wd>{_WD})\s+of\s+{_EVERY_MONTH}"
            rf"|(?:every|each)\s+month\s+on\s+the\s+(?P<ord2>{_ORD})\s+(?P<wd2>{_WD})"),
    ("monthday", r"(?:on\s+)?the\s+(?P<md>\d{1,2})(?:st|nd|rd|th)\s+of\s+" + _EVERY_MONTH
                 + r"|(?:every\s+month|monthly)\s+on\s+the\s+(?P<md2>\d{1,2})(?:st|nd|rd|th)"),
    ("lastday", r"(?:on\s+)?the\s+last\s+day\s+of\s+" + _EVERY_MONTH
                + r"|(?:every\s+month|monthly)\s+on\s+the\s+last\s+day"),
    ("yearly", rf"(?:every\s+year|yearly|annually)\s+on\s+(?:(?P<mon>{_MON})\s+(?P<d>\d{{1,2}})|(?P<d2>\d{{1,2}})\s+"
               rf"(?:of\s+)?(?P<mon2>{_MON}))(?:st|nd|rd|th)?|every\s+(?P<mon3>{_MON})\s+(?P<d3>\d{{1,2}})(?:st|nd|rd|th)?"),
))
_CLOCKED = re.compile(rf"(?P<rule>.+?){_AT}{CLOCK}")
_UNCLOCKED = re.compile(r"every\s+(?:(?P<n>\d+)\s+)?(?P<unit>hours?|minutes?|mins?)|hourly")


def _days_of(text: str) -> str:
    names = re.findall(_WD, text)
    found = sorted({WEEKDAYS[n] for n in names})
    return ",".join(_DAYS[d] for d in found)


_Groups = dict[str, "str | None"]


def _first(g: _Groups, *names: str) -> str:
    """The first of the named groups that matched (a shape spells one thing in several ways)."""
    return next(value for name in names if (value := g.get(name)) is not None)


_ON_DAYS: dict[str, Callable[[_Groups], str]] = {  # each shape of _SHAPES -> its RRULE without the time
    "daily": lambda g: "FREQ=DAILY",
    "days": lambda g: f"FREQ=DAILY;INTERVAL={g['n']}",
    "weekdays": lambda g: "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR",
    "weekends": lambda g: "FREQ=WEEKLY;BYDAY=SA,SU",
    "weekly": lambda g: (f"FREQ=WEEKLY;INTERVAL={2 if g['other'] else int(g['n'] or 1)};"
                         f"BYDAY={_days_of(_first(g, 'days', 'plural'))}"),
    "nth": lambda g: (f"FREQ=MONTHLY;BYDAY={_ORDINALS[_first(g, 'ord', 'ord2')]}"
                      f"{_DAYS[WEEKDAYS[_first(g, 'wd', 'wd2')]]}"),
    "monthday": lambda g: f"FREQ=MONTHLY;BYMONTHDAY={int(_first(g, 'md', 'md2'))}",
    "lastday": lambda g: "FREQ=MONTHLY;BYMONTHDAY=-1",
    "yearly": lambda g: (f"FREQ=YEARLY;BYMONTH={MONTHS[_first(g, 'mon', 'mon2', 'mon3')]};"
                         f"BYMONTHDAY={int(_first(g, 'd', 'd2', 'd3'))}"),
}


def _ends(lowered: str) -> tuple[str, str] | None:
    """'..., 5 times' / '... until 2027-06-30' -> (the rest, ';COUNT=5' / ';UNTIL=20270630' / '')."""
    tail = _TAIL.fullmatch(lowered)
    if tail is None:
        return None
    if tail.group("count"):
        return tail.group("body"), f";COUNT={tail.group('count')}"
    if tail.group("until"):
        return tail.group("body"), f";UNTIL={tail.group('until').replace('-', '')}"
    return tail.group("body"), ""


def _every_step(plain: re.Match[str], body: str) -> str:
    """'every 2 hours', 'every 15 minutes', 'hourly': on the clock when the step divides the day or the
    hour (every 15 minutes: :00, :15, ...), else every that long from the start."""
    n = int(plain.group("n") or 1)
    if n < 1:
        raise _bad("The step must be at least 1.")
    if body == "hourly" or (plain.group("unit") or "").startswith("h"):
        if 24 % n == 0 and n > 1:
            return f"FREQ=DAILY;BYHOUR={','.join(str(h) for h in range(0, 24, n))};BYMINUTE=0"
        return f"FREQ=HOURLY;INTERVAL={n};BYMINUTE=0"
    if 60 % n == 0:
        return f"FREQ=HOURLY;BYMINUTE={','.join(str(m) for m in range(0, 60, n))}"
    return f"FREQ=MINUTELY;INTERVAL={n}"


def _at_time(clocked: re.Match[str] | None, body: str, shown: str) -> str:
    """';BYHOUR=9;BYMINUTE=0' of a rule on days ('... at 9'); a rule on days without one is refused."""
    if clocked is None:
        raise _bad(f"{shown!r} does not say at what time: add it, e.g. '{body} at 9:00'.")
    try:
        at = clock_time(clocked, shown)
    except InvalidTime as exc:  # the time of day is wrong: say so with the rule forms
        raise _bad(exc.message.split(" Accepted forms")[0]) from None
    if at.second:
        raise _bad("Rules run on whole minutes; leave out the seconds.")
    return f";BYHOUR={at.hour};BYMINUTE={at.minute}"


def natural_rule(text: str) -> str | None:
    """Words -> an RRULE (not yet normalized); None when ``text`` is not in the grammar (see
    ``RULE_FORMS``). A rule on days needs its time ('at 9'); hours without am/pm are 24-hour. The
    words are read in three steps: how it ends (``_ends``), a step ('every 2 hours', ``_every_step``),
    or days (a shape of ``_SHAPES``, built by ``_ON_DAYS``) at a time (``_at_time``)."""
    ends = _ends(" ".join(text.lower().split()).rstrip("."))
    if ends is None:
        return None
    body, extra = ends
    plain = _UNCLOCKED.fullmatch(body)
    if plain:
        return _every_step(plain, body) + extra
    clocked = _CLOCKED.fullmatch(body)
    shape = clocked.group("rule") if clocked else body
    for name, pattern in _SHAPES:
        m = pattern.fullmatch(shape)
        if m is not None:
            return _ON_DAYS[name](m.groupdict()) + _at_time(clocked, body, text.strip()) + extra
    return None


def parse_rule(text: object, *, now: datetime, tz: ZoneInfo) -> Rule:
    """The ``cron`` argument -> the rule to store and its first run after ``now``."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidCron("cron is required: e.g. '0 9 * * MON-FRI', 'every weekday at 9' or "
                          "'FREQ=WEEKLY;BYDAY=MO;BYHOUR=9;BYMINUTE=0'.")
    shown = text.strip()
    if len(shown) > MAX_RULE_CHARS or timing._has_control(shown):
        raise _bad(f"The rule is longer than {MAX_RULE_CHARS} characters or holds control characters.")
    head = shown[:1]
    if head.isdigit() or head in "*?@":
        expr = timing.normalize_cron(shown)
        return Rule("cron", expr, None, timing.next_cron(expr, tz, now))
    upper = shown.upper()
    if upper.startswith(("RRULE:", "FREQ=")) or ";" in shown:
        rrule_text = shown
    else:
        found = natural_rule(shown)
        if found is None:
            raise _bad(f"Cannot read the rule {shown!r}.")
        rrule_text = found
    value, anchor = normalize_rrule(rrule_text, now=now, tz=tz)
    try:
        timing._rrule_at(value.split(";UNTIL=")[0], anchor.astimezone(tz).replace(tzinfo=None))
    except ValueError:  # dateutil: e.g. FREQ=HOURLY;INTERVAL=2;BYHOUR=1 from an even hour
        raise _bad(f"The rule {value!r} never fires: its INTERVAL never reaches the hours, minutes or days "
                   "it names from now.") from None
    first = timing.next_rrule(value, tz, now, anchor=anchor)
    if first is None:
        raise _bad(f"The rule {value!r} has no run after now (its COUNT or UNTIL ends it first).")
    return Rule("rrule", value, anchor, first)


# ---- in words, and the next runs ----------------------------------------------------------------


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _nth(n: int, *, words: bool = False) -> str:
    if n < 0:
        return "last" if n == -1 else f"{_nth(-n, words=words)} to last"
    if words and n <= 5:
        return ("first", "second", "third", "fourth", "fifth")[n - 1]
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True)
class _Said:
    """A normal-form rule's parts, as the describer reads them."""

    parts: dict[str, str]
    freq: str
    interval: int
    every: str  # 'every week', 'every 2 months'
    hours: list[int]
    minutes: list[int]
    plain: tuple[str, ...]  # weekdays without a number: ('Monday', 'Friday')
    numbered: list[str]  # 'last Friday', 'second Tuesday'
    months: list[str]
    monthdays: list[int]


_UNITS = {"MINUTELY": "minute", "HOURLY": "hour", "DAILY": "day", "WEEKLY": "week", "MONTHLY": "month",
          "YEARLY": "year"}


def _said(value: str) -> _Said:
    p = dict(item.split("=", 1) for item in value.split(";"))
    n, unit = int(p.get("INTERVAL", "1")), _UNITS[p["FREQ"]]
    days = [m for m in (_BYDAY_RE.fullmatch(d) for d in p.get("BYDAY", "").split(",") if d) if m]
    return _Said(
        parts=p, freq=p["FREQ"], interval=n, every=f"every {unit}" if n == 1 else f"every {n} {unit}s",
        hours=[int(h) for h in p.get("BYHOUR", "").split(",") if h],
        minutes=[int(m) for m in p.get("BYMINUTE", "").split(",") if m],
        plain=tuple(_DAY_NAMES[_DAYS.index(d.group(2))] for d in days if not d.group(1)),
        numbered=[f"{_nth(int(d.group(1)), words=True)} {_DAY_NAMES[_DAYS.index(d.group(2))]}"
                  for d in days if d.group(1)],
        months=[_MONTH_NAMES[int(m) - 1] for m in p.get("BYMONTH", "").split(",") if m],
        monthdays=[int(d) for d in p.get("BYMONTHDAY", "").split(",") if d],
    )


def _on_days(r: _Said) -> str:
    """' on Monday and Friday', ' on weekdays', ' on weekends' (or nothing)."""
    if r.plain == _DAY_NAMES[:5]:
        return " on weekdays"
    if r.plain == _DAY_NAMES[5:]:
        return " on weekends"
    return f" on {_join(list(r.plain))}" if r.plain else ""


def _dates_words(r: _Said) -> str:
    """A monthly or yearly rule on dates: 'on the last Friday of every month', 'every year on the 25th of
    December'; plain weekdays then narrow it ('(if a Friday)')."""
    which = r.numbered + [("last day" if d == -1 else f"{_nth(d)} day" if d < 0 else _nth(d)) for d in r.monthdays]
    of = f" of {_join(r.months)}" if r.freq == "YEARLY" and r.months else ""
    text = f"on the {_join(which)}{of} of {r.every}" if not of else f"{r.every} on the {_join(which)}{of}"
    return text + (_on_days(r) and f" (if a{_on_days(r)[3:]})")


def _days_words(r: _Said) -> str:
    """The days a rule runs on, the first part of its description."""
    if r.freq == "WEEKLY" and r.interval == 1 and r.plain:
        return "every weekday" if _on_days(r) == " on weekdays" else f"every {_join(list(r.plain))}"
    if r.freq in ("MONTHLY", "YEARLY") and (r.numbered or r.monthdays):
        return _dates_words(r)
    if r.freq == "YEARLY" and r.months:
        return f"{r.every} in {_join(r.months)}{_on_days(r)}"
    text = f"{r.every}{_on_days(r)}"
    if r.monthdays:
        text += f" on the {_join([_nth(d) for d in r.monthdays])} of the month"
    return text


def _times_words(r: _Said, text: str) -> str:
    """``text`` with the times of day: ' at 09:00', ' on the hour', ', every 2 hours from 00:00'."""
    hours, minutes = r.hours, r.minutes
    if r.freq == "MINUTELY":
        return text
    if r.freq == "HOURLY":
        return text + (f" at minute {_join([str(m) for m in minutes])}" if minutes != [0] else " on the hour")
    if len(hours) > 4 and len(minutes) == 1 and hours == list(range(hours[0], 24, hours[1] - hours[0])):
        step = f"every {hours[1] - hours[0]} hours from {hours[0]:02d}:{minutes[0]:02d}"
        return step if text == "every day" else f"{text}, {step}"
    if hours and minutes:
        return text + " at " + _join([f"{h:02d}:{m:02d}" for h in hours for m in minutes])
    return text


def _until_words(value: str, tz: ZoneInfo) -> str:
    until = datetime.strptime(value, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).astimezone(tz)
    return f", until {until:%Y-%m-%d %H:%M}"


_TAILS: tuple[tuple[str, Callable[[str, str, ZoneInfo], str]], ...] = (  # said last, in this order: (part,
    # its words from its value, the rule's unit and the zone)
    ("BYSETPOS", lambda v, unit, tz: f" (only the {_join([_nth(int(x)) for x in v.split(',')])} of each {unit})"),
    ("COUNT", lambda v, unit, tz: f", {v} times"),
    ("UNTIL", lambda v, unit, tz: _until_words(v, tz)),
)


@functools.lru_cache(maxsize=1024)  # pure; list describes every row
def _describe_rrule(value: str, tz: ZoneInfo) -> str:
    """A normal-form rule in words: its days (``_days_words``), months when not yearly, its times
    (``_times_words``), then BYSETPOS, COUNT and UNTIL (``_TAILS``)."""
    r = _said(value)
    text = _days_words(r)
    if r.months and r.freq != "YEARLY":
        text += f" in {_join(r.months)}"
    text = _times_words(r, text)
    for key, said in _TAILS:
        if key in r.parts:
            text += said(r.parts[key], _UNITS[r.freq], tz)
    return text[0].upper() + text[1:] + f" ({tz.key})"


def describe(schedule_type: str, value: str, tz: ZoneInfo, *, max_repetitions: int | None = None) -> str:
    """A schedule's rule in plain English, e.g. 'Every weekday at 09:00 (Europe/Berlin)'; the rule
    itself if it cannot be read (descriptions are never an error)."""
    times = f", {max_repetitions} times" if max_repetitions else ""
    try:
        if schedule_type == "once":
            at = datetime.fromisoformat(value).astimezone(tz)
            return f"Once, on {at:%A %d %B %Y at %H:%M} {at.tzname()} ({tz.key})"
        if schedule_type == "cron":
            return f"{timing.describe_cron(value)} ({tz.key}){times}"
        if schedule_type == "interval":
            return f"Every {timing.format_duration(timing.parse_interval(value))}{times}"
        if schedule_type == "rrule":
            return _describe_rrule(value, tz) + times
    except (PromptYoSelfError, ValueError, KeyError, IndexError, AttributeError):
        pass
    return value


def upcoming(
    schedule_type: str,
    value: str,
    tz: ZoneInfo,
    *,
    next_run: datetime | None,
    anchor: datetime | None,
    remaining: int | None = None,
    count: int = UPCOMING,
) -> list[datetime]:
    """The next ``count`` runs from ``next_run`` (fewer when the rule or ``remaining`` ends), each
    as the schedule's own rule computes it (``timing.next_run_after``)."""
    if next_run is None:
        return []
    limit = count if remaining is None else max(0, min(count, remaining))
    return list(_upcoming(schedule_type, value, tz, next_run, anchor, limit))


@functools.lru_cache(maxsize=4096)
def _upcoming(schedule_type: str, value: str, tz: ZoneInfo, next_run: datetime, anchor: datetime | None,
              limit: int) -> tuple[datetime, ...]:
    """``upcoming``, remembered: a pure function of its arguments, and ``list`` shows the same schedules'
    next runs again and again (a cron rule's five runs cost ~0.5 ms to compute)."""
    if schedule_type == "rrule" and anchor is not None:
        later = timing.rrule_instants(value, tz, anchor=anchor, after=next_run)
        return tuple(itertools.islice(itertools.chain([next_run], later), limit))
    out: list[datetime] = []
    if schedule_type == "cron":  # one croniter for all of them (``next_run_after`` parses per call)
        try:
            for slot in itertools.chain([next_run], timing.cron_instants(value, tz, next_run)):
                if len(out) >= limit:
                    break
                out.append(slot)
        except PromptYoSelfError:
            pass
        return tuple(out)
    at: datetime | None = next_run
    try:
        while at is not None and len(out) < limit:
            out.append(at)
            at = timing.next_run_after(schedule_type, value, tz, after=at, anchor=anchor or next_run)
    except PromptYoSelfError:
        pass
    return tuple(out)

