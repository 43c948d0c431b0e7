"""Recurring rules beyond cron (issue 21 points 2-3): RFC 5545 RRULE and rules in words, their normal
form, their runs across both DST changes in four zones, ``upcoming`` and ``description``; and a
property test that ``upcoming`` agrees with the stored rule's own iteration by python-dateutil."""

from __future__ import annotations

import bisect
import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from dateutil import rrule as du
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from promptyoself import timing
from promptyoself.errors import InvalidCron
from promptyoself.recurrence import describe, natural_rule, parse_rule, upcoming

BERLIN, NEW_YORK = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")
SYDNEY, KOLKATA = ZoneInfo("Australia/Sydney"), ZoneInfo("Asia/Kolkata")
ZONES = (BERLIN, NEW_YORK, SYDNEY, KOLKATA)


def local(zone: ZoneInfo, wall: str) -> datetime:
    return datetime.fromisoformat(wall).replace(tzinfo=zone)


# (zone, now as local wall time, the rule as written, stored normal form, its first runs in the zone)
RULES: list[tuple[ZoneInfo, str, str, str, list[str]]] = [
    # Berlin's spring-forward gap (Sun 2026-03-29 02:00-03:00): 02:30 keeps the offset before it
    (BERLIN, "2026-03-26 12:00", "every day at 2:30", "FREQ=DAILY;BYHOUR=2;BYMINUTE=30;BYSECOND=0",
     ["2026-03-27T02:30:00+01:00", "2026-03-28T02:30:00+01:00", "2026-03-29T03:30:00+02:00",
      "2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"]),
    (BERLIN, "2026-03-26 12:00", "every weekday at 9",
     "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=0;BYSECOND=0",
     ["2026-03-27T09:00:00+01:00", "2026-03-30T09:00:00+02:00", "2026-03-31T09:00:00+02:00",
      "2026-04-01T09:00:00+02:00", "2026-04-02T09:00:00+02:00"]),
    # Berlin's fall back (Sun 2026-10-25 03:00 -> 02:00): 02:30 runs once, the first time
    (BERLIN, "2026-10-23 12:00", "every day at 2:30", "FREQ=DAILY;BYHOUR=2;BYMINUTE=30;BYSECOND=0",
     ["2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00",
      "2026-10-27T02:30:00+01:00", "2026-10-28T02:30:00+01:00"]),
    (BERLIN, "2026-10-25 00:10", "FREQ=HOURLY;BYMINUTE=30", "FREQ=HOURLY;BYMINUTE=30;BYSECOND=0",
     ["2026-10-25T00:30:00+02:00", "2026-10-25T01:30:00+02:00", "2026-10-25T02:30:00+02:00",
      "2026-10-25T03:30:00+01:00", "2026-10-25T04:30:00+01:00"]),  # the repeated 02:30 runs once
    (NEW_YORK, "2026-03-05 12:00", "every 2 weeks on tuesday and thursday at 10:00",
     "FREQ=WEEKLY;INTERVAL=2;BYDAY=TU,TH;BYHOUR=10;BYMINUTE=0;BYSECOND=0",
     ["2026-03-17T10:00:00-04:00", "2026-03-19T10:00:00-04:00", "2026-03-31T10:00:00-04:00",
      "2026-04-02T10:00:00-04:00", "2026-04-14T10:00:00-04:00"]),
    (NEW_YORK, "2026-03-05 12:00", "FREQ=DAILY;BYHOUR=2;BYMINUTE=30;COUNT=5",
     "FREQ=DAILY;BYHOUR=2;BYMINUTE=30;BYSECOND=0;COUNT=5",
     ["2026-03-06T02:30:00-05:00", "2026-03-07T02:30:00-05:00", "2026-03-08T03:30:00-04:00",
      "2026-03-09T02:30:00-04:00", "2026-03-10T02:30:00-04:00"]),
    (NEW_YORK, "2026-10-29 12:00", "every day at 1:30", "FREQ=DAILY;BYHOUR=1;BYMINUTE=30;BYSECOND=0",
     ["2026-10-30T01:30:00-04:00", "2026-10-31T01:30:00-04:00", "2026-11-01T01:30:00-04:00",
      "2026-11-02T01:30:00-05:00", "2026-11-03T01:30:00-05:00"]),
    (NEW_YORK, "2026-03-05 12:00", "every monday at 10, 3 times",
     "FREQ=WEEKLY;BYDAY=MO;BYHOUR=10;BYMINUTE=0;BYSECOND=0;COUNT=3",
     ["2026-03-09T10:00:00-04:00", "2026-03-16T10:00:00-04:00", "2026-03-23T10:00:00-04:00"]),
    # Sydney: DST ends Sun 2026-04-05 (02:30 is repeated), starts Sun 2026-10-04 (02:30 does not exist)
    (SYDNEY, "2026-04-02 12:00", "every day at 2:30", "FREQ=DAILY;BYHOUR=2;BYMINUTE=30;BYSECOND=0",
     ["2026-04-03T02:30:00+11:00", "2026-04-04T02:30:00+11:00", "2026-04-05T02:30:00+11:00",
      "2026-04-06T02:30:00+10:00", "2026-04-07T02:30:00+10:00"]),
    (SYDNEY, "2026-10-01 12:00", "every day at 2:30", "FREQ=DAILY;BYHOUR=2;BYMINUTE=30;BYSECOND=0",
     ["2026-10-02T02:30:00+10:00", "2026-10-03T02:30:00+10:00", "2026-10-04T03:30:00+11:00",
      "2026-10-05T02:30:00+11:00", "2026-10-06T02:30:00+11:00"]),
    (SYDNEY, "2026-03-20 12:00", "last friday of every month at 17:00",
     "FREQ=MONTHLY;BYDAY=-1FR;BYHOUR=17;BYMINUTE=0;BYSECOND=0",
     ["2026-03-27T17:00:00+11:00", "2026-04-24T17:00:00+10:00", "2026-05-29T17:00:00+10:00",
      "2026-06-26T17:00:00+10:00", "2026-07-31T17:00:00+10:00"]),
    (KOLKATA, "2026-03-28 10:00", "first monday of the month at 9",
     "FREQ=MONTHLY;BYDAY=1MO;BYHOUR=9;BYMINUTE=0;BYSECOND=0",
     ["2026-04-06T09:00:00+05:30", "2026-05-04T09:00:00+05:30", "2026-06-01T09:00:00+05:30",
      "2026-07-06T09:00:00+05:30", "2026-08-03T09:00:00+05:30"]),
    (KOLKATA, "2026-03-28 10:00", "RRULE:FREQ=MONTHLY;BYDAY=-1FR;BYHOUR=17;BYMINUTE=0",
     "FREQ=MONTHLY;BYDAY=-1FR;BYHOUR=17;BYMINUTE=0;BYSECOND=0",
     ["2026-04-24T17:00:00+05:30", "2026-05-29T17:00:00+05:30", "2026-06-26T17:00:00+05:30",
      "2026-07-31T17:00:00+05:30", "2026-08-28T17:00:00+05:30"]),
    (KOLKATA, "2026-03-28 10:00", "freq=weekly;interval=2;byday=tu,th;byhour=10;byminute=0;until=20260415",
     "FREQ=WEEKLY;INTERVAL=2;BYDAY=TU,TH;BYHOUR=10;BYMINUTE=0;BYSECOND=0;UNTIL=20260415T182959Z",
     ["2026-04-07T10:00:00+05:30", "2026-04-09T10:00:00+05:30"]),  # UNTIL: the end of that day, local
    (KOLKATA, "2026-03-28 10:00", "every month on the 31st at 8:00",
     "FREQ=MONTHLY;BYMONTHDAY=31;BYHOUR=8;BYMINUTE=0;BYSECOND=0",
     ["2026-03-31T08:00:00+05:30", "2026-05-31T08:00:00+05:30", "2026-07-31T08:00:00+05:30",
      "2026-08-31T08:00:00+05:30", "2026-10-31T08:00:00+05:30"]),
    (KOLKATA, "2026-03-28 10:07", "every 15 minutes", "FREQ=HOURLY;BYMINUTE=0,15,30,45;BYSECOND=0",
     ["2026-03-28T10:15:00+05:30", "2026-03-28T10:30:00+05:30", "2026-03-28T10:45:00+05:30",
      "2026-03-28T11:00:00+05:30", "2026-03-28T11:15:00+05:30"]),
    (KOLKATA, "2026-03-28 10:07", "FREQ=DAILY", "FREQ=DAILY;BYHOUR=10;BYMINUTE=8;BYSECOND=0",  # from DTSTART
     ["2026-03-28T10:08:00+05:30", "2026-03-29T10:08:00+05:30", "2026-03-30T10:08:00+05:30",
      "2026-03-31T10:08:00+05:30", "2026-04-01T10:08:00+05:30"]),
    (BERLIN, "2026-03-26 12:00", "0 9 * * MON-FRI", "0 9 * * MON-FRI",  # cron stays cron
     ["2026-03-27T09:00:00+01:00", "2026-03-30T09:00:00+02:00", "2026-03-31T09:00:00+02:00",
      "2026-04-01T09:00:00+02:00", "2026-04-02T09:00:00+02:00"]),
]


@pytest.mark.parametrize(("zone", "now", "text", "stored", "runs"), RULES, ids=[f"{r[0].key}|{r[2]}" for r in RULES])
def test_rule_table(zone: ZoneInfo, now: str, text: str, stored: str, runs: list[str]) -> None:
    rule = parse_rule(text, now=local(zone, now), tz=zone)
    assert rule.value == stored
    assert rule.schedule_type == ("cron" if text[0].isdigit() else "rrule")
    got = upcoming(rule.schedule_type, rule.value, zone, next_run=rule.first, anchor=rule.anchor)
    assert [t.astimezone(zone).isoformat() for t in got] == runs
    # delivery advances the same way, one run at a time
    at, walked = rule.first, []
    while at is not None and len(walked) < 5:
        walked.append(at)
        at = timing.next_run_after(rule.schedule_type, rule.value, zone, after=at, anchor=rule.anchor)
    assert walked == got
    if len(runs) < 5:
        assert at is None  # COUNT / UNTIL: the rule has ended


@pytest.mark.parametrize(("text", "described"), [
    ("every weekday at 9", "Every weekday at 09:00 (Europe/Berlin)"),
    ("every day at 7:30", "Every day at 07:30 (Europe/Berlin)"),
    ("every monday at 10", "Every Monday at 10:00 (Europe/Berlin)"),
    ("every 2 weeks on tuesday and thursday at 10:00",
     "Every 2 weeks on Tuesday and Thursday at 10:00 (Europe/Berlin)"),
    ("last friday of every month at 17:00", "On the last Friday of every month at 17:00 (Europe/Berlin)"),
    ("first monday of the month at 9", "On the first Monday of every month at 09:00 (Europe/Berlin)"),
    ("every month on the 15th at 9", "On the 15th of every month at 09:00 (Europe/Berlin)"),
    ("the last day of the month at 18:00", "On the last day of every month at 18:00 (Europe/Berlin)"),
    ("every year on Dec 25 at 9", "Every year on the 25th of December at 09:00 (Europe/Berlin)"),
    ("every day at 9, 5 times", "Every day at 09:00, 5 times (Europe/Berlin)"),
    ("every hour", "Every hour on the hour (Europe/Berlin)"),
    ("every 2 hours", "Every 2 hours from 00:00 (Europe/Berlin)"),
    ("0 9 * * MON-FRI", "At 09:00, Monday through Friday (Europe/Berlin)"),
])
def test_descriptions_in_plain_english(text: str, described: str) -> None:
    rule = parse_rule(text, now=local(BERLIN, "2026-06-15 12:00"), tz=BERLIN)
    assert describe(rule.schedule_type, rule.value, BERLIN) == described


def test_descriptions_of_once_and_interval() -> None:
    assert describe("once", "2026-12-25T09:00:00+01:00", BERLIN) == (
        "Once, on Friday 25 December 2026 at 09:00 CET (Europe/Berlin)")
    assert describe("interval", "90m", BERLIN, max_repetitions=3) == "Every 1h 30m, 3 times"
    assert describe("rrule", "not a rule", BERLIN) == "not a rule"  # never an error


@pytest.mark.parametrize(("text", "words"), [
    ("every weekday", "does not say at what time"),
    ("every monday", "does not say at what time"),
    ("every fortnight at 9", "Cannot read the rule"),
    ("FREQ=SECONDLY", "FREQ must be one of"),
    ("FREQ=DAILY;BYSECOND=30", "Seconds are not supported"),
    ("FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30", "never fires"),
    ("FREQ=MONTHLY;BYDAY=MO;BYSETPOS=9;BYHOUR=9;BYMINUTE=0", "never fires"),
    ("FREQ=DAILY;COUNT=3;UNTIL=20270101", "COUNT or UNTIL, not both"),
    ("FREQ=DAILY;BYWEEKNO=3", "not supported"),
    ("DTSTART:20260101T000000;FREQ=DAILY", "not KEY=VALUE"),
    ("FREQ=WEEKLY;BYDAY=2MO", "numbered weekday needs FREQ=MONTHLY or YEARLY"),
    ("FREQ=MONTHLY;BYDAY=6MO", "out of range"),
    ("FREQ=DAILY;BYHOUR=24", "out of range"),
    ("FREQ=DAILY;INTERVAL=0", "whole number from 1"),
    ("FREQ=DAILY;UNTIL=20200101", "no run after now"),
    ("FREQ=DAILY;UNTIL=tomorrow", "is not a date"),
    ("every day at 25:00", "no such time"),
    ("0 9 * *", "has 4 fields, expected 5"),
    ("x" * 301, "longer than 300"),
])
def test_bad_rules_are_invalid_cron_saying_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(InvalidCron) as err:
        parse_rule(text, now=local(BERLIN, "2026-06-15 12:00"), tz=BERLIN)
    assert words in err.value.message
    if not text[0].isdigit():
        assert "every weekday at 9" in err.value.message  # the accepted forms


def test_words_compile_to_rrules() -> None:
    assert natural_rule("every other week on friday at 16:00") == "FREQ=WEEKLY;INTERVAL=2;BYDAY=FR;BYHOUR=16;BYMINUTE=0"
    assert natural_rule("Every Mon, Wed and Fri at 8am.") == "FREQ=WEEKLY;INTERVAL=1;BYDAY=MO,WE,FR;BYHOUR=8;BYMINUTE=0"
    assert natural_rule("every day at 9 until 2027-06-30") == "FREQ=DAILY;BYHOUR=9;BYMINUTE=0;UNTIL=20270630"
    assert natural_rule("every month on the second tuesday at 9") == "FREQ=MONTHLY;BYDAY=2TU;BYHOUR=9;BYMINUTE=0"
    assert natural_rule("tomorrow at 9") is None


def test_a_count_rule_ends_and_upcoming_shrinks() -> None:
    now = local(BERLIN, "2026-06-15 12:00")
    rule = parse_rule("FREQ=DAILY;BYHOUR=9;BYMINUTE=0;COUNT=2", now=now, tz=BERLIN)
    second = timing.next_run_after("rrule", rule.value, BERLIN, after=rule.first, anchor=rule.anchor)
    assert second == rule.first + timedelta(days=1)
    assert timing.next_run_after("rrule", rule.value, BERLIN, after=second, anchor=rule.anchor) is None
    assert upcoming("rrule", rule.value, BERLIN, next_run=second, anchor=rule.anchor) == [second]


def test_far_from_dtstart_iteration_starts_near_now() -> None:
    """A rule made years ago still answers at once (its DTSTART is moved on whole periods)."""
    made = local(BERLIN, "2020-01-01 00:00")
    rule = parse_rule("FREQ=MINUTELY;INTERVAL=7", now=made, tz=BERLIN)
    after = datetime(2031, 5, 5, 12, 0, 30, tzinfo=UTC)
    nxt = timing.next_rrule(rule.value, BERLIN, after, anchor=rule.anchor)
    assert nxt is not None and timedelta(0) < nxt - after <= timedelta(minutes=7)
    def wall(t: datetime) -> datetime:
        return t.astimezone(BERLIN).replace(tzinfo=None)

    assert (wall(nxt) - wall(rule.anchor)) % timedelta(minutes=7) == timedelta(0)  # INTERVAL keeps its phase


# ---- the property: upcoming agrees with the stored rule's own iteration -------------------------


ORACLE_WALK = 200_000
"""How many instants the brute-force oracle walks at most: 150 years of the densest yearly rule drawn
below (3 days a week x 3 hours x 2 minutes: 936 a year)."""


def oracle(value: str, tz: ZoneInfo, anchor: datetime, after: datetime, n: int) -> list[datetime]:
    """The rule's first ``n`` instants after ``after`` by brute force: dateutil iterates the stored
    rule from its DTSTART, each wall time is mapped as RFC 5545 says (fold=0: a gap keeps the offset
    before it), duplicates are one, and UNTIL cuts."""
    parts = [p for p in value.split(";") if not p.startswith("UNTIL=")]
    until = next((datetime.strptime(p[6:], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
                  for p in value.split(";") if p.startswith("UNTIL=")), None)
    rule = du.rrulestr(";".join(parts), dtstart=anchor.astimezone(tz).replace(tzinfo=None))
    found: list[datetime] = []  # the n earliest so far, in order, each once (a later one can only push one out)
    walked = 0
    for wall in itertools.islice(rule, ORACLE_WALK):
        walked += 1
        t = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
        if t > after and (until is None or t <= until) and t not in found:
            bisect.insort(found, t)
            del found[n:]
        if len(found) >= n and wall.replace(tzinfo=UTC) > found[n - 1] + timedelta(days=2):
            break
    else:
        # The rule ended, or the walk did: an oracle that ran out knows nothing, so it never answers.
        assert walked < ORACLE_WALK, f"the oracle walked {ORACLE_WALK} instants of {value} without reaching {after}"
    return found


FREQS = ("MINUTELY", "HOURLY", "DAILY", "WEEKLY", "MONTHLY", "YEARLY")
DAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")


@st.composite
def rules(draw: st.DrawFn) -> str:
    freq = draw(st.sampled_from(FREQS))
    parts = [f"FREQ={freq}", f"INTERVAL={draw(st.integers(1, 3))}"]
    if freq in ("DAILY", "WEEKLY", "MONTHLY", "YEARLY") or draw(st.booleans()):
        parts.append("BYHOUR=" + ",".join(map(str, draw(st.sets(st.sampled_from([0, 1, 2, 3, 9, 17, 23]), min_size=1,
                                                                  max_size=3)))))
    if freq != "MINUTELY":
        parts.append("BYMINUTE=" + ",".join(map(str, draw(st.sets(st.sampled_from([0, 15, 30, 59]), min_size=1,
                                                                    max_size=2)))))
    if freq in ("WEEKLY", "MONTHLY", "YEARLY") and draw(st.booleans()):
        days = draw(st.sets(st.sampled_from(DAYS), min_size=1, max_size=3))
        prefix = draw(st.sampled_from(["", "1", "-1", "2"])) if freq == "MONTHLY" else ""
        parts.append("BYDAY=" + ",".join(prefix + d for d in sorted(days)))
    elif freq in ("MONTHLY", "YEARLY") and draw(st.booleans()):
        parts.append(f"BYMONTHDAY={draw(st.sampled_from([1, 13, 28, 31, -1]))}")
    if draw(st.booleans()):
        parts.append(f"COUNT={draw(st.integers(1, 12))}")
    return ";".join(parts)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=rules(),
    zone=st.sampled_from(ZONES),
    made=st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2030, 12, 31)),  # noqa: DTZ001
    later=st.integers(0, 400),
)
def test_upcoming_agrees_with_the_stored_rules_own_iteration(text: str, zone: ZoneInfo, made: datetime,
                                                             later: int) -> None:
    now = made.replace(tzinfo=UTC)
    try:
        rule = parse_rule(text, now=now, tz=zone)
    except InvalidCron:
        return  # e.g. BYDAY=-1MO;COUNT=1 whose only run ... never mind: refused rules are tested above
    assert rule.anchor is not None
    expected = oracle(rule.value, zone, rule.anchor, now, 5)
    assert rule.first == expected[0]
    got = upcoming("rrule", rule.value, zone, next_run=rule.first, anchor=rule.anchor)
    assert got == expected
    # and far later, as delivery advances after a long time (DTSTART moved on whole periods)
    step = {"MINUTELY": timedelta(minutes=1), "HOURLY": timedelta(hours=1), "DAILY": timedelta(days=1),
            "WEEKLY": timedelta(days=7), "MONTHLY": timedelta(days=31), "YEARLY": timedelta(days=366)}
    freq = text.split(";")[0][5:]
    far = min(later, 150) if freq == "YEARLY" else later  # within the oracle's walk (ORACLE_WALK)
    after = now + far * step[freq] + timedelta(seconds=far * 37)
    want = oracle(rule.value, zone, rule.anchor, after, 3)
    ran = list(itertools.islice(timing.rrule_instants(rule.value, zone, anchor=rule.anchor, after=after), 3))
    assert ran == want
