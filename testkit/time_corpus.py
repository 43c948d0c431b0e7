"""Adversarial rules, phrases and intervals, in one place (issue 29 item 1): each with what PromptYoSelf
must answer. tests/test_time_corpus.py asserts the answers; ``python -m bench --only timelang``
measures the CPU time of each (target: at most 50 ms for any input).

An entry is ``(kind, text, expected)``: ``kind`` is ``rule`` (the ``cron`` argument: 5-field cron,
RRULE or words, ``recurrence.parse_rule``), ``time`` (a one-time instant, ``phrases.read_time`` then
``ensure_future``) or ``every`` (``timing.parse_interval``, and ``start_at`` when the text holds
``" from "``: ``every 10s from 9999-12-31T23:59:55Z``, ``timing.interval_slots_fit``); ``expected`` is
``ok`` or the error code. Everything is read at ``NOW`` in ``ZONE`` (or the zone after ``@``); the
bench also measures each at ``LATER`` (the answers may differ there: a rule's phase, a time past).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Literal
from zoneinfo import ZoneInfo

Kind = Literal["rule", "time", "every"]

NOW = datetime(2026, 11, 26, 12, 0, 30, tzinfo=UTC)  # a Thursday
LATER = datetime(2090, 3, 1, 8, 0, 0, tzinfo=UTC)  # the next 29 February that is a Sunday is in 2116
ZONE = "UTC"

_ALL_MINUTES = ",".join(str(m) for m in range(60))
_ALL_HOURS = ",".join(str(h) for h in range(24))

CORPUS: tuple[tuple[Kind, str, str], ...] = (
    # ---- RRULEs that never fire, or drift so that they may go centuries without a run -------------
    # issue 29: dateutil walked to the year 9999 (97 s of CPU)
    ("rule", "FREQ=MINUTELY;INTERVAL=7;BYMONTH=2;BYMONTHDAY=29;BYDAY=SU;BYHOUR=23;BYMINUTE=59", "invalid_cron"),
    ("rule", "FREQ=MINUTELY;INTERVAL=7;BYMONTH=2;BYMONTHDAY=29;BYHOUR=23;BYMINUTE=59", "invalid_cron"),
    ("rule", "FREQ=HOURLY;INTERVAL=5;BYMONTH=2;BYMONTHDAY=29;BYMINUTE=0", "invalid_cron"),
    ("rule", "FREQ=HOURLY;INTERVAL=7;BYDAY=SU;BYMINUTE=0", "invalid_cron"),
    ("rule", "FREQ=MINUTELY;BYMONTH=4;BYMONTHDAY=31", "invalid_cron"),
    ("rule", "FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30;BYHOUR=9;BYMINUTE=0", "invalid_cron"),
    ("rule", "FREQ=YEARLY;BYMONTH=4,6,9,11;BYMONTHDAY=31", "invalid_cron"),
    ("rule", "FREQ=DAILY;INTERVAL=7;BYDAY=SU;BYHOUR=9;BYMINUTE=0", "invalid_cron"),  # from a Thursday
    ("rule", "FREQ=DAILY;INTERVAL=1000;BYMONTH=2;BYMONTHDAY=29", "invalid_cron"),
    ("rule", "FREQ=DAILY;INTERVAL=2;BYMONTHDAY=31", "invalid_cron"),
    ("rule", "FREQ=WEEKLY;INTERVAL=2;BYMONTHDAY=13;BYDAY=FR;BYHOUR=9;BYMINUTE=0", "invalid_cron"),
    ("rule", "FREQ=WEEKLY;INTERVAL=1000;BYMONTH=2;BYDAY=SU", "invalid_cron"),
    ("rule", "FREQ=MONTHLY;INTERVAL=12;BYMONTH=3;BYMONTHDAY=1", "invalid_cron"),  # made in November
    ("rule", "FREQ=MONTHLY;INTERVAL=2;BYMONTH=2,4,6,8,10,12;BYMONTHDAY=1", "invalid_cron"),
    ("rule", "FREQ=MONTHLY;BYDAY=5MO;BYMONTHDAY=1", "invalid_cron"),  # the 5th Monday is never the 1st
    ("rule", "FREQ=MONTHLY;BYDAY=MO,1FR", "invalid_cron"),  # dateutil: days that are both
    ("rule", "FREQ=MONTHLY;BYDAY=5MO;BYSETPOS=2", "invalid_cron"),
    ("rule", "FREQ=MONTHLY;BYDAY=MO;BYSETPOS=6", "invalid_cron"),
    ("rule", "FREQ=WEEKLY;BYDAY=MO,TU;BYMONTHDAY=1;BYSETPOS=2", "invalid_cron"),
    ("rule", "FREQ=YEARLY;INTERVAL=4;BYMONTH=2;BYMONTHDAY=29;BYHOUR=9;BYMINUTE=0", "invalid_cron"),  # 2026+4k
    ("rule", "FREQ=YEARLY;INTERVAL=2;BYMONTH=2;BYMONTHDAY=29;BYDAY=SU", "ok"),
    ("rule", "FREQ=YEARLY;BYMONTH=2;BYDAY=-5SU;BYMONTHDAY=1", "ok"),  # 2032-02-01
    ("rule", "FREQ=YEARLY;BYMONTH=2;BYDAY=-5SU;BYMONTHDAY=2", "invalid_cron"),
    ("rule", "FREQ=YEARLY;BYDAY=20MO;BYMONTHDAY=1", "invalid_cron"),  # the 20th Monday is in mid-May
    ("rule", "FREQ=YEARLY;BYDAY=18MO;BYMONTHDAY=1", "ok"),
    ("rule", "FREQ=YEARLY;BYDAY=20MO;BYMONTHDAY=1;BYMONTH=1", "invalid_cron"),
    ("rule", "FREQ=YEARLY;BYDAY=53MO;BYMONTH=2", "invalid_cron"),
    ("rule", "FREQ=HOURLY;INTERVAL=2;BYHOUR=1", "invalid_cron"),  # from an even hour
    ("rule", "FREQ=MINUTELY;INTERVAL=720;BYHOUR=5;BYMINUTE=1", "invalid_cron"),
    # ---- sparse but real: accepted, their first run found at once ---------------------------------
    ("rule", "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=SU;BYHOUR=9;BYMINUTE=0", "ok"),  # 2032
    ("rule", "FREQ=DAILY;BYMONTH=2;BYMONTHDAY=29;BYDAY=SU;BYHOUR=23;BYMINUTE=59", "ok"),
    ("rule", "FREQ=WEEKLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=SU;BYHOUR=23;BYMINUTE=59", "ok"),
    ("rule", "FREQ=MINUTELY;INTERVAL=15;BYMONTH=2;BYMONTHDAY=29;BYDAY=SU;BYHOUR=23;BYMINUTE=46", "ok"),
    ("rule", "FREQ=MINUTELY;BYMONTH=2;BYMONTHDAY=29;BYDAY=SU", "ok"),
    ("rule", "FREQ=HOURLY;INTERVAL=8;BYMONTH=2;BYMONTHDAY=29;BYDAY=SU;BYMINUTE=0", "ok"),
    ("rule", "FREQ=MONTHLY;BYMONTH=2;BYDAY=5SU", "ok"),  # February with five Sundays: 2032
    ("rule", "FREQ=MONTHLY;BYDAY=5MO;BYMONTHDAY=29;BYMONTH=2", "ok"),
    ("rule", "FREQ=YEARLY;BYDAY=53MO", "ok"),
    ("rule", "FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1;BYHOUR=17;BYMINUTE=0", "ok"),
    ("rule", "FREQ=MINUTELY;INTERVAL=997;BYHOUR=23;BYMINUTE=59", "ok"),
    ("rule", "FREQ=MINUTELY;INTERVAL=7;BYHOUR=23;BYMINUTE=59", "ok"),
    ("rule", "FREQ=DAILY;INTERVAL=1000", "ok"),
    ("rule", "FREQ=MINUTELY;INTERVAL=1000", "ok"),
    ("rule", "FREQ=YEARLY;INTERVAL=100;BYMONTH=2;BYMONTHDAY=29", "invalid_cron"),  # 2026 + 100k: no leap year
    ("rule", "FREQ=YEARLY;INTERVAL=100", "ok"),
    ("rule", "FREQ=MINUTELY;INTERVAL=90;BYDAY=MO", "invalid_cron"),
    ("rule", "FREQ=MINUTELY;INTERVAL=720;BYMONTHDAY=1", "ok"),
    ("rule", "FREQ=YEARLY;INTERVAL=1000", "invalid_cron"),  # one period beyond the horizon
    ("rule", "FREQ=MONTHLY;INTERVAL=1000;BYMONTHDAY=31", "ok"),
    # ---- huge COUNT, far UNTIL, long lists ---------------------------------------------------------
    ("rule", "FREQ=MINUTELY;COUNT=1000", "ok"),
    ("rule", "FREQ=MINUTELY;COUNT=10000", "invalid_cron"),
    ("rule", "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=SU;COUNT=1000", "ok"),
    ("rule", "FREQ=DAILY;UNTIL=99991231T235959Z", "invalid_cron"),
    ("rule", "FREQ=DAILY;UNTIL=21260101", "ok"),
    ("rule", "FREQ=DAILY;BYMONTH=2;BYMONTHDAY=29;UNTIL=21000101", "ok"),
    ("rule", "FREQ=DAILY;UNTIL=20261126T120000Z", "invalid_cron"),  # ended before its first run
    ("rule", f"FREQ=DAILY;BYHOUR={_ALL_HOURS};BYMINUTE={_ALL_MINUTES}", "ok"),
    ("rule", f"FREQ=MINUTELY;BYHOUR={_ALL_HOURS};BYMINUTE={_ALL_MINUTES};COUNT=1000", "ok"),
    ("rule", "FREQ=YEARLY;BYMONTH=1,2,3,4,5,6,7,8,9,10,11,12;BYMONTHDAY=" + ",".join(map(str, range(1, 32))),
     "ok"),
    ("rule", "FREQ=YEARLY;BYDAY=" + ",".join(f"{n}MO" for n in range(1, 54)), "invalid_cron"),  # > 300 chars
    ("rule", "FREQ=YEARLY;BYDAY=" + ",".join(f"-{n}SU" for n in range(1, 40)) + ";BYSETPOS=-1", "ok"),
    ("rule", "FREQ=DAILY;" + "BYHOUR=9;" * 30, "invalid_cron"),
    ("rule", "FREQ=DAILY;INTERVAL=" + "9" * 200, "invalid_cron"),
    ("rule", "FREQ=DAILY;COUNT=" + "9" * 200, "invalid_cron"),
    ("rule", "RRULE:" + ";" * 280 + "FREQ=DAILY", "ok"),
    ("rule", "RRULE:" + ";" * 290 + "FREQ=DAILY", "invalid_cron"),  # > 300 characters
    # ---- cron (croniter): sparse leap-day rules and ones that never fire ---------------------------
    ("rule", "0 0 29 2 *", "ok"),
    ("rule", "0 0 29 2 1", "ok"),  # cron's day-of-month OR day-of-week: every Monday in February too
    ("rule", "59 23 29 2 SUN", "ok"),
    ("rule", "0 0 30 2 *", "invalid_cron"),
    ("rule", "0 0 31 2 *", "invalid_cron"),
    ("rule", "0 0 31 4,6,9,11 *", "invalid_cron"),
    ("rule", "0 0 L 2 *", "ok"),
    ("rule", "0 0 29 2 1#5", "ok"),
    ("rule", "0 0 * 2 1#5", "ok"),
    ("rule", "0 0 * * 1#6", "invalid_cron"),
    ("rule", "*/59 */23 */31 */12 */7", "ok"),
    ("rule", ",".join(map(str, range(0, 60))) + " * * * *", "invalid_cron"),  # > 100 characters
    ("rule", "0 0 1 1 * 2099", "invalid_cron"),
    ("rule", "@yearly", "ok"),
    # ---- words --------------------------------------------------------------------------------------
    ("rule", "every year on feb 29 at 9", "ok"),
    ("rule", "every feb 29 at 23:59", "ok"),
    ("rule", "every 1000 days at 9", "ok"),
    ("rule", "every 999 minutes", "ok"),
    ("rule", "every 997 hours", "ok"),
    ("rule", "last friday of every month at 17:00", "ok"),
    ("rule", "fifth monday of every month at 9", "ok"),
    ("rule", "every month on the 31st at 9", "ok"),
    ("rule", "every day at 9, 1000 times", "ok"),
    ("rule", "every day at 9, 99999 times", "invalid_cron"),
    ("rule", "every day at 9 until 9999-12-31", "invalid_cron"),
    ("rule", "every " + "monday and " * 25 + "monday at 9", "ok"),
    ("rule", "every " + "monday " * 40 + "at 9", "invalid_cron"),
    ("rule", "every " + "1" * 280 + " days at 9", "invalid_cron"),
    ("rule", "last " * 59 + "friday", "invalid_cron"),
    ("rule", "every 2 weeks on " + ", ".join(["tue", "thu"] * 20) + " at 10", "ok"),
    # ---- one-time phrases ---------------------------------------------------------------------------
    ("time", "Feb 29 at 9", "ok"),
    ("time", "29 February 2027 09:00", "invalid_time"),
    ("time", "in 99999 days", "invalid_time"),
    ("time", "in " + "9" * 96, "invalid_time"),
    ("time", "in " + "1h " * 32, "ok"),
    ("time", "9999-12-28T23:59:59Z", "ok"),
    ("time", "9999-12-31T23:59:59Z", "out_of_range"),
    ("time", "9999-12-31 23:59 Pacific/Kiritimati", "out_of_range"),
    ("time", "9999-12-31T23:59:59-12:00", "invalid_time"),  # past datetime.max in UTC
    ("time", "10000-01-01", "invalid_time"),
    ("time", "0001-01-01T00:00:00Z", "out_of_range"),
    ("time", "Dec 31 9999 at 23:59", "out_of_range"),
    ("time", "monday " * 14, "invalid_time"),
    ("time", "at " * 33, "invalid_time"),
    ("time", "1" * 100, "time_in_past"),  # (dateutil reads it as a date in the past)
    ("time", "9" * 101, "invalid_time"),
    ("time", "tomorrow at 9 " + "[Europe/Berlin]" * 5, "invalid_time"),
    ("time", "2026-12-25 " + "10:00 " * 15, "invalid_time"),
    ("time", "Dec " * 25, "invalid_time"),
    ("time", "next " * 20 + "friday at 9", "invalid_time"),
    # ---- intervals and where their slots go --------------------------------------------------------
    ("every", "10s from 9999-12-31T23:59:55Z", "out_of_range"),
    ("every", "10s from 9999-12-31 23:59 @Pacific/Kiritimati", "out_of_range"),
    ("every", "3660d from 9990-01-01T00:00:00Z", "out_of_range"),
    ("every", "1d from 2027-01-01T00:00:00Z", "ok"),
    ("every", "P3660D", "ok"),
    ("every", "P3661D", "invalid_interval"),
    ("every", "9" * 100, "invalid_interval"),
    ("every", "1s " * 33, "ok"),
    ("every", "1" + "0" * 99, "invalid_interval"),
)


def answer(kind: Kind, text: str, *, now: datetime = NOW) -> str:
    """What PromptYoSelf answers for one entry: ``ok`` or the error's code."""
    from promptyoself import phrases, recurrence, timing
    from promptyoself.errors import PromptYoSelfError

    body, _, zone_name = text.partition(" @")
    tz = ZoneInfo(zone_name or ZONE)
    try:
        if kind == "rule":  # read, and its next runs as ``list`` shows them
            rule = recurrence.parse_rule(body, now=now, tz=tz)
            recurrence.upcoming(rule.schedule_type, rule.value, tz, next_run=rule.first, anchor=rule.anchor)
        elif kind == "time":
            read = phrases.read_time(body, now=now, tz=tz)
            phrases.ensure_future(read.instant, now=now, tz=read.zone or tz)
        else:
            every, _, start = body.partition(" from ")
            step = timing.parse_interval(every)
            if start:
                read = phrases.read_time(start, now=now, tz=tz)
                timing.interval_slots_fit(read.instant, step)
    except PromptYoSelfError as exc:
        return exc.code
    return "ok"


def cpu_of(kind: Kind, text: str, *, now: datetime = NOW) -> tuple[str, float]:
    """The answer and the CPU time it took (``time.process_time``, seconds), caches cleared first."""
    from promptyoself import recurrence, timing

    for cached in (timing._rrule_parts, timing._rrule_at, timing._normalized_cron, recurrence._describe_rrule,
                   recurrence._upcoming):
        cached.cache_clear()
    start = time.process_time()
    got = answer(kind, text, now=now)
    return got, time.process_time() - start
