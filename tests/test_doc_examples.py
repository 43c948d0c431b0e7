"""Every example in the docs' tables of times and rules is accepted (issue 32 point 5): the tables of
docs/promptyoself-tools.md's "Time and rule forms" and README's table of tools, read here, so an
example added to a table is tested at once. Plus the phrase frictions of the same point."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from promptyoself import phrases, recurrence, timing
from promptyoself.errors import InvalidArgument, InvalidTime, TimeInPast

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 6, 15, 10, 0, tzinfo=UTC)  # a Monday, 12:00 in Berlin
BERLIN = ZoneInfo("Europe/Berlin")


def table_after(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table after ``heading`` (header and rule lines left out)."""
    lines = text[text.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def examples(cell: str) -> list[str]:
    return [e for e in re.findall(r"`([^`]+)`", cell) if not e.startswith("...")]


DOC = (ROOT / "docs" / "promptyoself-tools.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
TIMES = [e for row in table_after(DOC, "### One-time times") for e in examples(row[1])]
WORDS = [(e, row[1]) for row in table_after(DOC, "### Recurring rules") for e in examples(row[0])]
TOOLS = {row[0].strip("`"): examples(row[1]) for row in table_after(README, "| tool | what it does |")}


def test_the_tables_were_found() -> None:
    assert len(TIMES) > 30 and len(WORDS) > 20 and "mondays at 10" in dict(WORDS)
    assert TOOLS["promptyoself_schedule_time"] and TOOLS["promptyoself_schedule_cron"]


@pytest.mark.parametrize("text", TIMES + TOOLS["promptyoself_schedule_time"])
def test_every_documented_time_is_read(text: str) -> None:
    when = phrases.read_time(text, now=NOW, tz=BERLIN)
    phrases.ensure_future(when.instant, now=NOW, tz=BERLIN)


@pytest.mark.parametrize(("text", "stored"), WORDS)
def test_every_documented_rule_in_words_is_read(text: str, stored: str) -> None:
    rule = recurrence.parse_rule(text, now=NOW, tz=BERLIN)
    written = examples(stored)[0]
    if text == next(t for t, s in WORDS if s == stored):  # the stored form shown is the first example's
        prefix = written.split("...")[0].rstrip(";")
        assert rule.value.startswith(prefix), (rule.value, written)


@pytest.mark.parametrize("text", TOOLS["promptyoself_schedule_cron"])
def test_every_rule_in_the_readme_is_read(text: str) -> None:
    recurrence.parse_rule(text, now=NOW, tz=BERLIN)


@pytest.mark.parametrize("text", [e for e in TOOLS["promptyoself_schedule_every"] if any(c.isdigit() for c in e)])
def test_every_interval_in_the_readme_is_read(text: str) -> None:
    timing.parse_interval(text)


@pytest.mark.parametrize("text", ["mondays at 10", "fridays at 17:00", "Mondays at 10:00"])
def test_plural_weekdays_are_weekly_rules(text: str) -> None:
    rule = recurrence.parse_rule(text, now=NOW, tz=BERLIN)
    assert rule.value.startswith("FREQ=WEEKLY;BYDAY=")


def test_yesterday_is_in_the_past_not_unreadable() -> None:
    when = phrases.read_time("yesterday at 9", now=NOW, tz=BERLIN)
    with pytest.raises(TimeInPast):
        phrases.ensure_future(when.instant, now=NOW, tz=BERLIN)


def test_zones_are_suggested_only_for_zone_like_words() -> None:
    with pytest.raises(InvalidTime) as err:
        phrases.read_time("christmas", now=NOW, tz=BERLIN)
    assert "Indian/Christmas" not in err.value.message and "A zone goes last" not in err.value.message
    with pytest.raises(InvalidTime) as err:
        phrases.read_time("tomorrow 9am Berlin", now=NOW, tz=BERLIN)
    assert "Did you mean 'Europe/Berlin'?" in err.value.message


def test_a_zone_abbreviation_is_one_rule_in_a_time_and_as_the_timezone() -> None:
    with pytest.raises(InvalidTime) as in_time:
        phrases.read_time("tomorrow 9am EST", now=NOW, tz=BERLIN)
    with pytest.raises(InvalidArgument) as as_zone:
        timing.resolve_zone("EST")
    assert as_zone.value.code == "invalid_argument"
    assert as_zone.value.message in in_time.value.message and "'America/New_York'" in as_zone.value.message
