"""One-time times as people write them (issue 21 point 1): a table with a fixed "now" in four zones,
on days around both DST changes (promptyoself/phrases.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from promptyoself.errors import InvalidArgument, InvalidTime, TimeInPast
from promptyoself.phrases import TIME_FORMS, ensure_future, read_time
from promptyoself.timing import resolve_zone

BERLIN, NEW_YORK = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")
SYDNEY, KOLKATA = ZoneInfo("Australia/Sydney"), ZoneInfo("Asia/Kolkata")

# (zone, "now" as local wall time, the phrase, what it means: ISO 8601 with the zone's offset then)
# Berlin: spring forward Sun 2026-03-29 02:00 -> 03:00, fall back Sun 2026-10-25 03:00 -> 02:00.
# New York: spring forward Sun 2026-03-08 02:00 -> 03:00, fall back Sun 2026-11-01 02:00 -> 01:00.
# Sydney: DST ends Sun 2026-04-05 03:00 -> 02:00, starts Sun 2026-10-04 02:00 -> 03:00.
TABLE: list[tuple[ZoneInfo, str, str, str]] = [
    # Berlin, Saturday before spring forward, 10:00 CET
    (BERLIN, "2026-03-28 10:00", "tomorrow at 9am", "2026-03-29T09:00:00+02:00"),
    (BERLIN, "2026-03-28 10:00", "tomorrow 9", "2026-03-29T09:00:00+02:00"),
    (BERLIN, "2026-03-28 10:00", "tomorrow 2:30", "2026-03-29T03:00:00+02:00"),  # in the gap: after it
    (BERLIN, "2026-03-28 10:00", "today 17:30", "2026-03-28T17:30:00+01:00"),
    (BERLIN, "2026-03-28 10:00", "at 18:00", "2026-03-28T18:00:00+01:00"),
    (BERLIN, "2026-03-28 10:00", "at 9", "2026-03-29T09:00:00+02:00"),  # passed today: tomorrow
    (BERLIN, "2026-03-28 10:00", "9pm", "2026-03-28T21:00:00+01:00"),
    (BERLIN, "2026-03-28 10:00", "noon", "2026-03-28T12:00:00+01:00"),
    (BERLIN, "2026-03-28 10:00", "midnight", "2026-03-29T00:00:00+01:00"),
    (BERLIN, "2026-03-28 10:00", "monday 9:00", "2026-03-30T09:00:00+02:00"),
    (BERLIN, "2026-03-28 10:00", "saturday 9:00", "2026-04-04T09:00:00+02:00"),  # today's weekday: next week
    (BERLIN, "2026-03-28 10:00", "next friday at 14:30", "2026-04-03T14:30:00+02:00"),
    (BERLIN, "2026-03-28 10:00", "in 2 hours", "2026-03-28T12:00:00+01:00"),
    (BERLIN, "2026-03-28 10:00", "in 90 minutes", "2026-03-28T11:30:00+01:00"),
    (BERLIN, "2026-03-28 10:00", "in 3 days", "2026-03-31T11:00:00+02:00"),  # 72 hours, across the change
    (BERLIN, "2026-03-28 10:00", "Dec 25 at 9", "2026-12-25T09:00:00+01:00"),
    (BERLIN, "2026-03-28 10:00", "25 December 2027 09:00", "2027-12-25T09:00:00+01:00"),
    (BERLIN, "2026-03-28 10:00", "2027-01-15 9am", "2027-01-15T09:00:00+01:00"),
    (BERLIN, "2026-03-28 10:00", "March 1st at 8am", "2027-03-01T08:00:00+01:00"),  # passed: next year
    (BERLIN, "2026-03-28 10:00", "9am on Monday", "2026-03-30T09:00:00+02:00"),
    (BERLIN, "2026-03-28 10:00", "12am", "2026-03-29T00:00:00+01:00"),
    (BERLIN, "2026-03-28 10:00", "12pm", "2026-03-28T12:00:00+01:00"),
    (BERLIN, "2026-03-28 10:00", "At 9:30 P.M.", "2026-03-28T21:30:00+01:00"),
    # Berlin, Saturday before fall back, 12:00 CEST
    (BERLIN, "2026-10-24 12:00", "tomorrow at 9am", "2026-10-25T09:00:00+01:00"),
    (BERLIN, "2026-10-24 12:00", "tomorrow 2:30", "2026-10-25T02:30:00+02:00"),  # repeated: the first
    (BERLIN, "2026-10-24 12:00", "in 1 day", "2026-10-25T11:00:00+01:00"),
    (BERLIN, "2026-10-24 12:00", "sunday noon", "2026-10-25T12:00:00+01:00"),
    # New York, Saturday before spring forward, 23:30 EST
    (NEW_YORK, "2026-03-07 23:30", "9am", "2026-03-08T09:00:00-04:00"),
    (NEW_YORK, "2026-03-07 23:30", "at 2:30", "2026-03-08T03:00:00-04:00"),  # the gap
    (NEW_YORK, "2026-03-07 23:30", "midnight", "2026-03-08T00:00:00-05:00"),
    (NEW_YORK, "2026-03-07 23:30", "tomorrow at 9am", "2026-03-08T09:00:00-04:00"),
    (NEW_YORK, "2026-03-07 23:30", "next monday at 8", "2026-03-09T08:00:00-04:00"),
    # New York, Saturday before fall back, 20:00 EDT
    (NEW_YORK, "2026-10-31 20:00", "tomorrow 1:30", "2026-11-01T01:30:00-04:00"),  # repeated: the first
    (NEW_YORK, "2026-10-31 20:00", "in 2 hours", "2026-10-31T22:00:00-04:00"),
    (NEW_YORK, "2026-10-31 20:00", "Nov 1 at 17:00", "2026-11-01T17:00:00-05:00"),
    # Sydney, Saturday before DST ends (03:00 AEDT -> 02:00 AEST), 10:00 AEDT
    (SYDNEY, "2026-04-04 10:00", "tomorrow at 2:30", "2026-04-05T02:30:00+11:00"),  # repeated: the first
    (SYDNEY, "2026-04-04 10:00", "tomorrow at 9am", "2026-04-05T09:00:00+10:00"),
    (SYDNEY, "2026-04-04 10:00", "monday 9:00", "2026-04-06T09:00:00+10:00"),
    # Sydney, Saturday before DST starts (02:00 AEST -> 03:00 AEDT), 10:00 AEST
    (SYDNEY, "2026-10-03 10:00", "tomorrow 2:30", "2026-10-04T03:00:00+11:00"),  # the gap
    (SYDNEY, "2026-10-03 10:00", "tomorrow 9pm", "2026-10-04T21:00:00+11:00"),
    # Kolkata: no DST, a half-hour offset
    (KOLKATA, "2026-03-28 10:00", "tomorrow at 9am", "2026-03-29T09:00:00+05:30"),
    (KOLKATA, "2026-03-28 10:00", "in 3 days", "2026-03-31T10:00:00+05:30"),
    (KOLKATA, "2026-03-28 10:00", "friday 18:45", "2026-04-03T18:45:00+05:30"),
    (KOLKATA, "2026-03-28 10:00", "Feb 29 at 9", "2028-02-29T09:00:00+05:30"),  # the next leap year
    (KOLKATA, "2026-03-28 10:00", "2026-12-25", "2026-12-25T00:00:00+05:30"),  # a full date alone: 00:00
    (KOLKATA, "2026-03-28 10:00", "2026-12-25T10:00:00-05:00", "2026-12-25T20:30:00+05:30"),  # an offset wins
]


def local(zone: ZoneInfo, wall: str) -> datetime:
    return datetime.fromisoformat(wall).replace(tzinfo=zone)


@pytest.mark.parametrize(("zone", "now", "phrase", "expected"), TABLE,
                         ids=[f"{z.key}|{n}|{p}" for z, n, p, _ in TABLE])
def test_phrase_table(zone: ZoneInfo, now: str, phrase: str, expected: str) -> None:
    got = read_time(phrase, now=local(zone, now).astimezone(UTC), tz=zone)
    assert got.zone is None
    assert got.instant.tzinfo is UTC
    assert got.instant.astimezone(zone).isoformat() == expected


def test_case_and_spaces_do_not_matter() -> None:
    now = local(BERLIN, "2026-03-28 10:00")
    assert read_time("  TOMORROW   At 9AM ", now=now, tz=BERLIN) == read_time("tomorrow at 9am", now=now, tz=BERLIN)


@pytest.mark.parametrize(("phrase", "zone", "expected"), [
    ("2026-12-25 09:00 Europe/Berlin", "Europe/Berlin", "2026-12-25T09:00:00+01:00"),
    ("2026-12-25 09:00 europe/berlin", "Europe/Berlin", "2026-12-25T09:00:00+01:00"),
    ("tomorrow 9am America/New_York", "America/New_York", "2026-03-29T09:00:00-04:00"),
    ("2026-12-25 09:00 [Asia/Kolkata]", "Asia/Kolkata", "2026-12-25T09:00:00+05:30"),
    ("2026-12-25 10:00 UTC", "UTC", "2026-12-25T10:00:00+00:00"),
])
def test_a_zone_written_in_the_time_is_read_there_and_returned(phrase: str, zone: str, expected: str) -> None:
    got = read_time(phrase, now=local(BERLIN, "2026-03-28 10:00"), tz=BERLIN)
    assert got.zone is not None and got.zone.key == zone
    assert got.instant.astimezone(got.zone).isoformat() == expected


@pytest.mark.parametrize(("phrase", "words"), [
    ("9", "ambiguous"),
    ("friday", "names a day but not the time"),
    ("Dec 25", "names a day but not the time"),
    ("tomorrow", "names a day but not the time"),
    ("tomorrow midnight", "ambiguous"),
    ("13pm", "1 to 12"),
    ("25:00", "no such time"),
    ("9:75", "no such time"),
    ("2027-02-30 9am", "not a date"),
    ("banana", "Cannot read"),
    ("tomorrow at 9am Berlin", "Europe/Berlin"),  # a city is not a zone: the suggestion says which
    ("sometime next week", "Cannot read"),
])
def test_ambiguous_or_unreadable_phrases_are_invalid_time_listing_the_forms(phrase: str, words: str) -> None:
    with pytest.raises(InvalidTime) as err:
        read_time(phrase, now=local(BERLIN, "2026-03-28 10:00"), tz=BERLIN)
    assert err.value.code == "invalid_time"
    assert words in err.value.message
    assert "tomorrow at 9am" in err.value.message and "next friday at 14:30" in err.value.message
    assert TIME_FORMS in err.value.message or "A zone goes last" in err.value.message


def test_a_past_phrase_is_time_in_past_naming_now() -> None:
    now = local(BERLIN, "2026-03-28 10:00").astimezone(UTC)
    when = read_time("today 9:00", now=now, tz=BERLIN).instant
    with pytest.raises(TimeInPast) as err:
        ensure_future(when, now=now, tz=BERLIN)
    assert err.value.code == "time_in_past" and "2026-03-28 10:00" in err.value.message


def test_next_weekday_on_that_weekday_is_a_week_later_both_ways() -> None:
    now = local(BERLIN, "2026-03-30 08:00")  # a Monday, before 9
    plain = read_time("monday 9:00", now=now, tz=BERLIN).instant
    nxt = read_time("next monday 9:00", now=now, tz=BERLIN).instant
    assert plain == nxt == local(BERLIN, "2026-04-06 09:00").astimezone(UTC)


def test_a_clock_time_equal_to_now_is_tomorrow() -> None:
    now = local(BERLIN, "2026-06-15 18:00")
    assert read_time("at 18:00", now=now, tz=BERLIN).instant == now + timedelta(days=1)


@pytest.mark.parametrize(("name", "expected"), [
    ("europe/berlin", "Europe/Berlin"), ("AMERICA/NEW_YORK", "America/New_York"), ("utc", "UTC"),
    ("Asia/Kolkata", "Asia/Kolkata"),
])
def test_zones_in_any_case(name: str, expected: str) -> None:
    assert resolve_zone(name).key == expected


@pytest.mark.parametrize(("name", "suggested"), [
    ("Berlin", "Europe/Berlin"), ("New York", "America/New_York"), ("Europe/Berln", "Europe/Berlin"),
    ("kolkata", "Asia/Kolkata"),
])
def test_a_near_miss_zone_names_the_nearest(name: str, suggested: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        resolve_zone(name)
    assert f"Did you mean '{suggested}'" in err.value.message
