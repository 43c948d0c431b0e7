"""Tests for promptyoself.timing. Every test uses a fixed ``now``; no wall clock."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime, timedelta
from itertools import islice, pairwise
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptyoself.errors import (
    InvalidArgument,
    InvalidCron,
    InvalidInterval,
    InvalidTime,
    TimeInPast,
)
from promptyoself.phrases import ensure_future, parse_time
from promptyoself.timing import (
    MAX_RULE_CHARS,
    cron_instants,
    describe_cron,
    ensure_aware,
    format_duration,
    local_to_utc,
    next_cron,
    next_interval_slot,
    next_run_after,
    normalize_cron,
    parse_interval,
    resolve_zone,
    to_local_iso,
    to_utc_iso,
)

NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def firings(expr: str, tz: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    out: list[datetime] = []
    after = start
    while True:
        after = next_cron(expr, tz, after)
        if after >= end:
            return out
        out.append(after)
        assert len(out) < 10_000


def assert_strictly_increasing(items: list[datetime]) -> None:
    assert all(a < b for a, b in pairwise(items))
    assert len(set(items)) == len(items)


# ---------------------------------------------------------------------------
# resolve_zone


def test_resolve_zone_default_and_names() -> None:
    assert resolve_zone(None) == ZoneInfo("UTC")
    assert resolve_zone("") == ZoneInfo("UTC")
    assert resolve_zone("   ", default="Europe/Berlin") == BERLIN
    assert resolve_zone("Europe/Berlin") == BERLIN
    assert resolve_zone(" America/New_York ") == NEW_YORK
    assert resolve_zone("Z") == ZoneInfo("UTC")
    assert resolve_zone("utc") == ZoneInfo("UTC")


@pytest.mark.parametrize("name", ["Mars/Olympus", "Europe/Berln", "../etc/passwd", "A" * 65, "Europe/\nBerlin"])
def test_resolve_zone_rejects(name: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        resolve_zone(name)
    assert "Unknown timezone" in exc.value.message
    assert "Europe/Berlin" in exc.value.message


# ---------------------------------------------------------------------------
# parse_time


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-25T10:00:00-05:00", utc(2026, 12, 25, 15, 0)),
        ("2026-12-25T10:00:00+05:30", utc(2026, 12, 25, 4, 30)),
        ("2026-12-25T10:00:00Z", utc(2026, 12, 25, 10, 0)),
        ("2026-12-25 10:00 UTC", utc(2026, 12, 25, 10, 0)),
        ("2026-12-25 10:00 GMT", utc(2026, 12, 25, 10, 0)),
        ("2026-12-25 10:00 +05:30", utc(2026, 12, 25, 4, 30)),
        ("2026-12-25 10:00 America/New_York", utc(2026, 12, 25, 15, 0)),
        ("2026-12-25T10:00[Asia/Tokyo]", utc(2026, 12, 25, 1, 0)),
    ],
)
def test_parse_time_absolute_instants(text: str, expected: datetime) -> None:
    # the tz argument must not matter when the text carries its own zone
    for tz in (BERLIN, NEW_YORK, ZoneInfo("UTC")):
        got = parse_time(text, now=NOW, tz=tz)
        assert got == expected
        assert got.tzinfo is UTC


def test_parse_time_naive_uses_tz() -> None:
    # winter: Berlin UTC+1, New York UTC-5
    assert parse_time("2026-12-25 10:00", now=NOW, tz=BERLIN) == utc(2026, 12, 25, 9)
    assert parse_time("2026-12-25T10:00", now=NOW, tz=NEW_YORK) == utc(2026, 12, 25, 15)
    # summer: Berlin UTC+2, New York UTC-4
    assert parse_time("2026-07-01 10:00", now=NOW, tz=BERLIN) == utc(2026, 7, 1, 8)
    assert parse_time("2026-07-01 10:00", now=NOW, tz=NEW_YORK) == utc(2026, 7, 1, 14)
    # free-form dates go through dateutil and are local too
    assert parse_time("Dec 25 2026 10am", now=NOW, tz=BERLIN) == utc(2026, 12, 25, 9)
    assert parse_time("25 December 2026 10:00", now=NOW, tz=NEW_YORK) == utc(2026, 12, 25, 15)
    # date only -> local midnight
    assert parse_time("2026-12-25", now=NOW, tz=BERLIN) == utc(2026, 12, 24, 23)


def test_parse_time_naive_in_dst_gap_and_overlap() -> None:
    # Berlin 2026-03-29 02:30 does not exist -> first instant after the gap (03:00 CEST)
    assert parse_time("2026-03-29 02:30", now=NOW, tz=BERLIN) == utc(2026, 3, 29, 1)
    # Berlin 2026-10-25 02:30 happens twice -> the first one (CEST)
    assert parse_time("2026-10-25 02:30", now=NOW, tz=BERLIN) == utc(2026, 10, 25, 0, 30)
    # New York 2026-03-08 02:30 gap -> 03:00 EDT; 2026-11-01 01:30 overlap -> EDT
    assert parse_time("2026-03-08 02:30", now=NOW, tz=NEW_YORK) == utc(2026, 3, 8, 7)
    assert parse_time("2026-11-01 01:30", now=NOW, tz=NEW_YORK) == utc(2026, 11, 1, 5, 30)


@pytest.mark.parametrize(
    ("text", "delta"),
    [
        ("in 5m", timedelta(minutes=5)),
        ("+2h", timedelta(hours=2)),
        ("in 1h30m", timedelta(hours=1, minutes=30)),
        ("in 90 seconds", timedelta(seconds=90)),
        ("in 2 days", timedelta(days=2)),
        ("in 1 hour", timedelta(hours=1)),
        ("+30s", timedelta(seconds=30)),
        ("IN 5 Minutes", timedelta(minutes=5)),
        ("in an hour", timedelta(hours=1)),
        ("in 1 hour and 30 minutes", timedelta(hours=1, minutes=30)),
        ("in 2h 15m", timedelta(hours=2, minutes=15)),
    ],
)
def test_parse_time_relative(text: str, delta: timedelta) -> None:
    assert parse_time(text, now=NOW, tz=BERLIN) == NOW + delta
    # a non-UTC aware now is the same instant
    assert parse_time(text, now=NOW.astimezone(NEW_YORK), tz=BERLIN) == NOW + delta


@pytest.mark.parametrize(
    "text",
    [
        "banana",
        "",
        "   ",
        "Dec 25",  # no year
        "2026",
        "5",
        "tomorrow",
        "now",
        "in 5x",
        "in",
        "-5m",
        "2026-12-25 10:00\n",
        "2026-12-25\x0010:00",
        "2026-12-25 10:00 EST",  # ambiguous abbreviation
        "2026-12-25 10:00 Mars/Olympus",
        "9999-12-31T23:59:59-05:00",  # out of range in UTC
        "2026-02-30 10:00",
        "x" * (MAX_RULE_CHARS + 1),
    ],
)
def test_parse_time_rejects_garbage(text: str) -> None:
    with pytest.raises(InvalidTime) as exc:
        parse_time(text, now=NOW, tz=BERLIN)
    assert exc.value.code == "invalid_time"
    assert exc.value.message


def test_parse_time_garbage_message_lists_forms() -> None:
    with pytest.raises(InvalidTime) as exc:
        parse_time("banana", now=NOW, tz=BERLIN)
    msg = exc.value.message
    assert "banana" in msg
    assert "in 5m" in msg
    assert "2026-12-25T10:00:00-05:00" in msg


def test_parse_time_does_not_check_past() -> None:
    assert parse_time("2020-01-01T00:00:00Z", now=NOW, tz=BERLIN) == utc(2020, 1, 1)


# ---------------------------------------------------------------------------
# ensure_future


def test_ensure_future_accepts_future() -> None:
    ensure_future(NOW + timedelta(seconds=1), now=NOW, tz=BERLIN)


def test_ensure_future_past_message_names_now() -> None:
    now = utc(2026, 11, 22, 14, 40)
    with pytest.raises(TimeInPast) as exc:
        ensure_future(utc(2026, 1, 1, 9), now=now, tz=BERLIN)
    msg = exc.value.message
    assert exc.value.code == "time_in_past"
    assert "2026-01-01T09:00:00+00:00" in msg
    assert "2026-11-22T14:40:00+00:00" in msg
    assert "15:40 Europe/Berlin" in msg
    assert "in 5m" in msg


def test_ensure_future_equal_is_past() -> None:
    with pytest.raises(TimeInPast):
        ensure_future(NOW, now=NOW, tz=BERLIN)


# ---------------------------------------------------------------------------
# parse_interval


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("1h", timedelta(hours=1)),
        ("1d", timedelta(days=1)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("2h 15m", timedelta(hours=2, minutes=15)),
        ("90", timedelta(seconds=90)),
        (90, timedelta(seconds=90)),
        (" 5 minutes ", timedelta(minutes=5)),
        ("PT15M", timedelta(minutes=15)),
        ("pt15m", timedelta(minutes=15)),
        ("P1D", timedelta(days=1)),
        ("PT1H30M", timedelta(hours=1, minutes=30)),
        ("P1W", timedelta(weeks=1)),
        ("every 5m", timedelta(minutes=5)),
    ],
)
def test_parse_interval_ok(text: str | int, expected: timedelta) -> None:
    assert parse_interval(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "0s",
        "0",
        0,
        "-5m",
        -5,
        "1x",
        "",
        "abc",
        "P1M",  # months have no fixed length
        "P1Y",
        "PT",
        "PT0.5S",  # under a second
        "3661d",  # more than ~10 years
        "99999999999999999999d",
        "5" * (MAX_RULE_CHARS + 1),
        "5m\n",
    ],
)
def test_parse_interval_rejects(text: str | int) -> None:
    with pytest.raises(InvalidInterval) as exc:
        parse_interval(text)
    assert exc.value.code == "invalid_interval"


def test_parse_interval_message_lists_forms() -> None:
    with pytest.raises(InvalidInterval) as exc:
        parse_interval("1x")
    assert "'1x'" in exc.value.message
    assert "PT15M" in exc.value.message


def test_parse_interval_rejects_bool() -> None:
    with pytest.raises(InvalidInterval):
        parse_interval(True)


# ---------------------------------------------------------------------------
# normalize_cron / describe_cron


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("0 9 * * MON-FRI", "0 9 * * MON-FRI"),
        ("  0   9 * *  mon-fri ", "0 9 * * MON-FRI"),
        ("30 8 1 JAN *", "30 8 1 JAN *"),
        ("*/15 * * * *", "*/15 * * * *"),
        ("0 0 29 2 *", "0 0 29 2 *"),
        ("0 0 L * *", "0 0 L * *"),
        ("@hourly", "@hourly"),
        ("@daily", "@daily"),
        ("@DAILY", "@daily"),
        ("@weekly", "@weekly"),
        ("@monthly", "@monthly"),
        ("@yearly", "@yearly"),
        ("@annually", "@annually"),
        ("@midnight", "@midnight"),
    ],
)
def test_normalize_cron_ok(expr: str, expected: str) -> None:
    assert normalize_cron(expr) == expected


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "0 0 * *",  # 4 fields
        "0 0 * * * *",  # 6 fields (seconds)
        "0 0 1 1 * 2030 x",
        "60 * * * *",
        "0 24 * * *",
        "0 0 0 * *",
        "0 0 * 13 *",
        "0 0 * * 8",
        "0 0 * * FOO",
        "0 0 * FOO *",
        "*/0 * * * *",
        "@reboot",
        "@daily 5",
        "0\t0 * * *",
        "0 0 * * *\n",
        "0 0 31 2 *",  # never fires
        "0 0 30 2 *",
        "0 0 31 4,6,9,11 *",
        "1 " * 51,
    ],
)
def test_normalize_cron_rejects(expr: str) -> None:
    with pytest.raises(InvalidCron) as exc:
        normalize_cron(expr)
    assert exc.value.code == "invalid_cron"


def test_normalize_cron_messages() -> None:
    with pytest.raises(InvalidCron) as exc:
        normalize_cron("0 0 31 2 *")
    assert "never fires" in exc.value.message
    with pytest.raises(InvalidCron) as exc:
        normalize_cron("0 0 * * * *")
    assert "6 fields" in exc.value.message
    assert "0 9 * * MON-FRI" in exc.value.message


def test_cron_dom_dow_are_ored() -> None:
    # standard cron: day-of-month OR day-of-week when both are restricted
    got = firings("0 12 13 * FRI", ZoneInfo("UTC"), utc(2026, 2, 1), utc(2026, 2, 28))
    days = [d.day for d in got]
    assert days == [6, 13, 20, 27]  # Fridays in Feb 2026 plus the 13th (also a Friday)
    got = firings("0 12 1 * MON", ZoneInfo("UTC"), utc(2026, 6, 1), utc(2026, 6, 16))
    assert [d.day for d in got] == [1, 8, 15]  # June 1 is a Monday: listed once
    assert normalize_cron("0 0 31 2 MON") == "0 0 31 2 MON"  # Mondays in February


def test_describe_cron() -> None:
    assert describe_cron("0 9 * * MON-FRI") == "At 09:00, Monday through Friday"
    assert describe_cron("*/15 * * * *") == "Every 15 minutes"
    assert describe_cron("@daily") == "At 00:00"
    assert describe_cron("not a cron") == "not a cron"


# ---------------------------------------------------------------------------
# next_cron basics


def test_next_cron_basic_utc_and_zone() -> None:
    assert next_cron("0 9 * * *", ZoneInfo("UTC"), NOW) == utc(2026, 6, 16, 9)
    # Berlin summer is UTC+2 -> 09:00 local = 07:00Z
    assert next_cron("0 9 * * *", BERLIN, NOW) == utc(2026, 6, 16, 7)
    assert next_cron("0 15 * * *", BERLIN, NOW) == utc(2026, 6, 15, 13)
    assert next_cron("0 13 * * *", BERLIN, NOW) == utc(2026, 6, 16, 11)
    # strictly after: an exact slot is not returned again
    assert next_cron("0 12 * * *", ZoneInfo("UTC"), NOW) == utc(2026, 6, 16, 12)
    # 2026-06-15 is a Monday; weekdays at 09:00 New York (UTC-4)
    assert next_cron("0 9 * * MON-FRI", NEW_YORK, NOW) == utc(2026, 6, 15, 13)
    assert next_cron("@monthly", ZoneInfo("UTC"), NOW) == utc(2026, 7, 1)
    assert next_cron("0 0 1 JAN *", ZoneInfo("UTC"), NOW) == utc(2027, 1, 1)


def test_next_cron_naive_after_is_utc_and_result_aware() -> None:
    got = next_cron("0 9 * * *", ZoneInfo("UTC"), datetime(2026, 6, 15, 12))  # noqa: DTZ001
    assert got == utc(2026, 6, 16, 9)
    assert got.tzinfo is UTC


def test_next_cron_leap_day() -> None:
    assert next_cron("0 0 29 2 *", ZoneInfo("UTC"), NOW) == utc(2028, 2, 29)


def test_next_cron_invalid() -> None:
    with pytest.raises(InvalidCron):
        next_cron("0 0 31 2 *", BERLIN, NOW)


# ---------------------------------------------------------------------------
# DST: daily rules fire exactly once per local date


DAILY_CASES = [
    # (zone, rule, window start, window end, transition date, expected instant that day)
    # Berlin spring: 02:30 does not exist on 2026-03-29 -> 03:00 CEST = 01:00Z
    (BERLIN, "30 2 * * *", utc(2026, 3, 26), utc(2026, 4, 1), date(2026, 3, 29), utc(2026, 3, 29, 1)),
    # Berlin autumn: 02:30 happens twice on 2026-10-25 -> first (CEST) = 00:30Z
    (BERLIN, "30 2 * * *", utc(2026, 10, 22), utc(2026, 10, 28), date(2026, 10, 25), utc(2026, 10, 25, 0, 30)),
    # New York spring: 02:30 does not exist on 2026-03-08 -> 03:00 EDT = 07:00Z
    (NEW_YORK, "30 2 * * *", utc(2026, 3, 5), utc(2026, 3, 11), date(2026, 3, 8), utc(2026, 3, 8, 7)),
    # New York autumn: 01:30 happens twice on 2026-11-01 -> first (EDT) = 05:30Z
    (NEW_YORK, "30 1 * * *", utc(2026, 10, 29), utc(2026, 11, 4), date(2026, 11, 1), utc(2026, 11, 1, 5, 30)),
    # same rules in later years
    (BERLIN, "30 2 * * *", utc(2030, 3, 28), utc(2030, 4, 3), date(2030, 3, 31), utc(2030, 3, 31, 1)),
    (NEW_YORK, "30 1 * * *", utc(2031, 10, 30), utc(2031, 11, 5), date(2031, 11, 2), utc(2031, 11, 2, 5, 30)),
]  # fmt: skip


@pytest.mark.parametrize(("tz", "rule", "start", "end", "day", "expected"), DAILY_CASES)
def test_daily_cron_once_per_local_date_across_dst(
    tz: ZoneInfo,
    rule: str,
    start: datetime,
    end: datetime,
    day: date,
    expected: datetime,
) -> None:
    got = firings(rule, tz, start, end)
    assert_strictly_increasing(got)
    per_date = Counter(f.astimezone(tz).date() for f in got)
    assert all(count == 1 for count in per_date.values()), per_date
    # never skips a day: every local date in the window is present
    local_dates = sorted(per_date)
    assert (local_dates[-1] - local_dates[0]).days + 1 == len(local_dates)
    assert len(local_dates) >= 5
    assert day in per_date
    assert [f for f in got if f.astimezone(tz).date() == day] == [expected]
    # every other day fires at the nominal wall time
    hh, mm = int(rule.split()[1]), int(rule.split()[0])
    for f in got:
        local = f.astimezone(tz)
        if local.date() != day:
            assert (local.hour, local.minute) == (hh, mm)


def test_daily_gap_slot_after_is_gap_end_does_not_refire() -> None:
    # asking again from the fired instant moves to the next day
    fired = next_cron("30 2 * * *", BERLIN, utc(2026, 3, 28, 12))
    assert fired == utc(2026, 3, 29, 1)
    assert next_cron("30 2 * * *", BERLIN, fired) == utc(2026, 3, 30, 0, 30)


def test_daily_overlap_no_second_firing_when_asked_during_repeat_hour() -> None:
    # 02:20 CET on 2026-10-25 (second pass of the hour): 02:30 already ran in CEST
    after = utc(2026, 10, 25, 1, 20)
    assert after.astimezone(BERLIN).fold == 1
    assert next_cron("30 2 * * *", BERLIN, after) == utc(2026, 10, 26, 1, 30)
    # New York: 01:10 EST on 2026-11-01 (second pass), 01:30 already ran in EDT
    after = utc(2026, 11, 1, 6, 10)
    assert next_cron("30 1 * * *", NEW_YORK, after) == utc(2026, 11, 2, 6, 30)


def test_half_hour_dst_zone_gap() -> None:
    # Lord Howe springs forward 30 minutes: 2026-10-04 02:00 -> 02:30 local
    tz = ZoneInfo("Australia/Lord_Howe")
    got = next_cron("15 2 * * *", tz, utc(2026, 10, 3, 12))
    local = got.astimezone(tz)
    assert (local.date(), local.hour, local.minute) == (date(2026, 10, 4), 2, 30)


# ---------------------------------------------------------------------------
# DST: hourly rules


def test_hourly_berlin_spring_gap_collapses() -> None:
    got = firings("0 * * * *", BERLIN, utc(2026, 3, 28, 21), utc(2026, 3, 29, 5))
    assert_strictly_increasing(got)
    assert got == [
        utc(2026, 3, 28, 22),  # 23:00 CET
        utc(2026, 3, 28, 23),  # 00:00 CET
        utc(2026, 3, 29, 0),  # 01:00 CET
        utc(2026, 3, 29, 1),  # 02:00 does not exist; 03:00 CEST, one run
        utc(2026, 3, 29, 2),  # 04:00 CEST
        utc(2026, 3, 29, 3),
        utc(2026, 3, 29, 4),
    ]


def test_hourly_berlin_fall_back_fires_each_wall_slot_once() -> None:
    got = firings("0 * * * *", BERLIN, utc(2026, 10, 24, 21), utc(2026, 10, 25, 5))
    assert_strictly_increasing(got)
    assert got == [
        utc(2026, 10, 24, 22),  # 00:00 CEST
        utc(2026, 10, 24, 23),  # 01:00 CEST
        utc(2026, 10, 25, 0),  # 02:00 CEST (fold=0)
        # 02:00 CET (01:00Z) does NOT fire: that wall slot already ran
        utc(2026, 10, 25, 2),  # 03:00 CET
        utc(2026, 10, 25, 3),
        utc(2026, 10, 25, 4),
    ]
    local_slots = [f.astimezone(BERLIN).strftime("%H:%M") for f in got]
    assert len(set(local_slots)) == len(local_slots)


def test_quarter_hourly_berlin_gap_runs_once_at_gap_end() -> None:
    got = firings("*/15 * * * *", BERLIN, utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 31))
    assert got == [
        utc(2026, 3, 29, 0, 45),  # 01:45 CET
        utc(2026, 3, 29, 1, 0),  # 02:00-02:45 collapse into 03:00 CEST with 03:00 slot
        utc(2026, 3, 29, 1, 15),
        utc(2026, 3, 29, 1, 30),
    ]


@pytest.mark.parametrize(
    ("tz", "start"),
    [
        (NEW_YORK, utc(2026, 3, 7, 20)),
        (NEW_YORK, utc(2026, 10, 31, 20)),
        (BERLIN, utc(2030, 3, 30, 20)),
        (BERLIN, utc(2031, 10, 25, 20)),
    ],
)
@pytest.mark.parametrize("rule", ["0 * * * *", "*/15 * * * *", "30 * * * *"])
def test_subdaily_across_transitions_no_duplicates(tz: ZoneInfo, start: datetime, rule: str) -> None:
    got = firings(rule, tz, start, start + timedelta(hours=14))
    assert_strictly_increasing(got)
    assert all(f.tzinfo is UTC for f in got)
    # each local wall-clock slot (date, HH:MM) fires at most once
    slots = Counter(f.astimezone(tz).strftime("%Y-%m-%d %H:%M") for f in got)
    assert max(slots.values()) == 1
    # gaps between firings never exceed one step plus one DST hour
    step = timedelta(minutes=15) if rule.startswith("*/15") else timedelta(hours=1)
    assert all(b - a <= step + timedelta(hours=1) for a, b in pairwise(got))


def test_local_to_utc_gap_and_overlap() -> None:
    naive = datetime(2026, 3, 29, 2, 30)  # noqa: DTZ001
    assert local_to_utc(naive, BERLIN) == utc(2026, 3, 29, 1)
    naive = datetime(2026, 10, 25, 2, 30)  # noqa: DTZ001
    assert local_to_utc(naive, BERLIN) == utc(2026, 10, 25, 0, 30)
    naive = datetime(2026, 7, 1, 12)  # noqa: DTZ001
    assert local_to_utc(naive, BERLIN) == utc(2026, 7, 1, 10)


@settings(max_examples=150, deadline=None)
@given(
    offset_minutes=st.integers(min_value=0, max_value=6 * 365 * 24 * 60),
    rule=st.sampled_from(["30 2 * * *", "0 * * * *", "*/15 * * * *", "0 9 * * MON-FRI", "0 3 L * *"]),
)
def test_property_next_cron_strictly_increasing(offset_minutes: int, rule: str) -> None:
    after = utc(2026, 1, 1) + timedelta(minutes=offset_minutes)
    prev = after
    for _ in range(4):
        nxt = next_cron(rule, BERLIN, prev)
        assert nxt.tzinfo is not None
        assert nxt.utcoffset() == timedelta(0)
        assert nxt > prev
        prev = nxt


# ---------------------------------------------------------------------------
# intervals


def test_next_interval_slot_fixed_rate() -> None:
    start = utc(2026, 6, 15, 12)
    every = timedelta(minutes=5)
    after = start + timedelta(hours=1, seconds=1)
    assert next_interval_slot(start, every, after) == start + timedelta(minutes=65)
    # exactly on a slot -> the following slot
    assert next_interval_slot(start, every, start + timedelta(hours=1)) == start + timedelta(minutes=65)
    # before the start -> the start itself
    assert next_interval_slot(start, every, start - timedelta(days=3)) == start
    # at the start -> the second slot
    assert next_interval_slot(start, every, start) == start + every


def test_next_interval_slot_no_drift_far_out() -> None:
    start = utc(2026, 6, 15, 12, 0, 0)
    every = timedelta(seconds=7)
    after = start + timedelta(days=3650, microseconds=123)
    got = next_interval_slot(start, every, after)
    assert (got - start) % every == timedelta(0)
    assert after < got <= after + every
    assert next_interval_slot(start, every, got - timedelta(microseconds=1)) == got


def test_next_interval_slot_rejects_non_positive() -> None:
    with pytest.raises(InvalidInterval):
        next_interval_slot(NOW, timedelta(0), NOW)


@settings(max_examples=200, deadline=None)
@given(
    every_s=st.integers(min_value=1, max_value=86400 * 30),
    after_s=st.integers(min_value=-86400, max_value=86400 * 3650),
)
def test_property_next_interval_slot(every_s: int, after_s: int) -> None:
    start = utc(2026, 6, 15, 12)
    every = timedelta(seconds=every_s)
    after = start + timedelta(seconds=after_s)
    got = next_interval_slot(start, every, after)
    assert got > after
    assert got >= start
    assert (got - start) % every == timedelta(0)
    assert got == start or got - every <= after


# ---------------------------------------------------------------------------
# dispatcher and formatting


def test_next_run_after() -> None:
    assert next_run_after("once", "2026-12-25T10:00:00Z", BERLIN, after=NOW) is None
    assert next_run_after("cron", "0 9 * * *", BERLIN, after=NOW) == utc(2026, 6, 16, 7)
    anchor = utc(2026, 6, 15, 11, 58)
    assert next_run_after("interval", "5m", BERLIN, after=NOW, anchor=anchor) == utc(2026, 6, 15, 12, 3)
    with pytest.raises(InvalidArgument):
        next_run_after("interval", "5m", BERLIN, after=NOW)
    with pytest.raises(InvalidArgument):
        next_run_after("weekly", "x", BERLIN, after=NOW)


def test_iso_helpers() -> None:
    dt = utc(2026, 11, 22, 14, 40)
    assert to_utc_iso(dt) == "2026-11-22T14:40:00+00:00"
    assert to_utc_iso(dt.astimezone(BERLIN)) == "2026-11-22T14:40:00+00:00"
    assert to_local_iso(dt, BERLIN) == "2026-11-22T15:40:00+01:00"
    assert to_local_iso(dt, NEW_YORK) == "2026-11-22T09:40:00-05:00"
    with pytest.raises(ValueError):
        to_utc_iso(datetime(2026, 11, 22, 14, 40))  # noqa: DTZ001


def test_ensure_aware() -> None:
    naive = datetime(2026, 6, 15, 12)  # noqa: DTZ001
    assert ensure_aware(naive) == NOW
    assert ensure_aware(naive).tzinfo is UTC
    got = ensure_aware(NOW.astimezone(BERLIN))
    assert got == NOW
    assert got.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("td", "text"),
    [
        (timedelta(hours=2, minutes=5), "2h 5m"),
        (timedelta(hours=2, minutes=5, seconds=30), "2h 5m"),
        (timedelta(seconds=45), "45s"),
        (timedelta(days=1, hours=3), "1d 3h"),
        (timedelta(days=1, seconds=5), "1d 5s"),
        (timedelta(0), "0s"),
        (timedelta(milliseconds=250), "250ms"),
        (-timedelta(minutes=5), "-5m"),
    ],
)
def test_format_duration(td: timedelta, text: str) -> None:
    assert format_duration(td) == text


@pytest.mark.parametrize("expr", ["30 2 * * *", "0 9 * * MON-FRI", "*/20 1-3 * * *", "0 0 29 2 *", "15 3 * 3,10 SUN"])
@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC"])
def test_cron_instants_walks_the_same_firings_as_next_cron_chained(expr: str, zone: str) -> None:
    """``cron_instants`` (one croniter, what ``upcoming`` lists) gives, across DST changes, exactly the
    firings that ``next_cron`` gives called again after each one."""
    tz = ZoneInfo(zone)
    for start in (datetime(2026, 3, 27, tzinfo=UTC), datetime(2026, 10, 23, tzinfo=UTC),
                  datetime(2026, 4, 3, 12, tzinfo=UTC)):
        walked = list(islice(cron_instants(expr, tz, start), 12))
        chained, at = [], start
        for _ in range(12):
            at = next_cron(expr, tz, at)
            chained.append(at)
        assert walked == chained
