"""Issue 29 items 1-2, the time side: every rule, phrase and interval is answered in bounded time with
the right code (the corpus in testkit/time_corpus.py; its CPU time is ``python -m bench --only
timelang``), the rules walked a year at a time keep dateutil's runs, slots never leave the calendar
(``out_of_range``, never OverflowError), and a bad row already stored does not break any list."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from dateutil import rrule as du
from fastmcp import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from promptyoself import timing
from promptyoself.core.operations import Core
from promptyoself.errors import InvalidCron, OutOfRange
from promptyoself.faces import cli
from promptyoself.faces.http import build_service_app
from promptyoself.faces.mcp import build_server
from promptyoself.recurrence import parse_rule
from promptyoself.store import schedules
from promptyoself.store.records import ScheduleRow
from testkit.time_corpus import CORPUS, answer
from tests.conftest import FIXED_NOW, make_settings

AGENT = "agent-11111111-2222-3333-4444-555555555555"
TOKEN = "time-bounds-token-0123456789"


@pytest.mark.parametrize(("kind", "text", "expected"), CORPUS, ids=[f"{k}:{t[:60]}" for k, t, _ in CORPUS])
def test_each_adversarial_input_gets_its_answer(kind: Any, text: str, expected: str) -> None:
    assert answer(kind, text) == expected


def test_the_sparse_rule_of_the_report_is_refused_saying_why() -> None:
    with pytest.raises(InvalidCron) as err:
        parse_rule("FREQ=MINUTELY;INTERVAL=7;BYMONTH=2;BYMONTHDAY=29;BYDAY=SU;BYHOUR=23;BYMINUTE=59",
                   now=FIXED_NOW, tz=ZoneInfo("UTC"))
    assert "INTERVAL" in err.value.message and "drift" in err.value.message


# ---- rules on days walked as yearly rules: the same runs as dateutil's own walk --------------------


def oracle(value: str, tz: ZoneInfo, anchor: datetime, after: datetime, n: int) -> list[datetime]:
    """dateutil's own walk of the stored rule from its DTSTART (the first ``n`` instants after ``after``)."""
    rule = du.rrulestr(value, dtstart=anchor.astimezone(tz).replace(tzinfo=None))
    found: list[datetime] = []
    for wall in rule.xafter(after.astimezone(tz).replace(tzinfo=None) - timedelta(days=1), inc=True):
        t = timing.rfc5545_to_utc(wall, tz)
        if t > after and t not in found:
            found.append(t)
        if len(found) >= n:
            break
    return sorted(found)[:n]


@st.composite
def day_limited(draw: st.DrawFn) -> str:
    freq, step = draw(st.sampled_from([("DAILY", 1), ("WEEKLY", 1), ("HOURLY", 1), ("HOURLY", 6), ("MINUTELY", 15),
                                       ("MINUTELY", 1), ("MINUTELY", 120)]))
    parts = [f"FREQ={freq}", f"INTERVAL={step}"]
    if draw(st.booleans()):
        parts.append("BYMONTH=" + ",".join(map(str, sorted(draw(st.sets(st.integers(1, 12), min_size=1, max_size=3))))))
    if draw(st.booleans()):
        parts.append(f"BYMONTHDAY={draw(st.sampled_from([1, 13, 28, 29, -1]))}")
    if freq == "WEEKLY" or draw(st.booleans()) or len(parts) == 2:
        parts.append("BYDAY=" + ",".join(sorted(draw(st.sets(st.sampled_from(["MO", "TU", "FR", "SU"]), min_size=1,
                                                              max_size=2)))))
    if freq != "MINUTELY" or draw(st.booleans()):
        parts.append("BYMINUTE=" + ",".join(map(str, sorted(draw(st.sets(st.sampled_from([0, 15, 31, 46]),
                                                                        min_size=1, max_size=2))))))
    if freq not in ("HOURLY", "MINUTELY") or draw(st.booleans()):
        parts.append("BYHOUR=" + ",".join(map(str, sorted(draw(st.sets(st.sampled_from([0, 2, 9, 23]), min_size=1,
                                                                      max_size=2))))))
    if draw(st.booleans()):
        parts.append(f"COUNT={draw(st.integers(1, 8))}")
    return ";".join(parts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=day_limited(), zone=st.sampled_from([ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")]),
       made=st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2030, 12, 31)),  # noqa: DTZ001
       later=st.integers(0, 40))
def test_rules_on_days_walked_a_year_at_a_time_keep_their_runs(text: str, zone: ZoneInfo, made: datetime,
                                                               later: int) -> None:
    now = made.replace(tzinfo=UTC)
    try:
        rule = parse_rule(text, now=now, tz=zone)
    except InvalidCron:
        return
    assert rule.anchor is not None
    after = now + timedelta(days=later, minutes=later * 7)
    want = oracle(rule.value, zone, rule.anchor, after, 3)
    got = list(itertools.islice(timing.rrule_instants(rule.value, zone, anchor=rule.anchor, after=after), 3))
    assert got == want


# ---- the end of the calendar ----------------------------------------------------------------------


def test_interval_slots_near_the_end_of_the_calendar_are_out_of_range_not_overflow() -> None:
    start = datetime(9999, 12, 31, 23, 59, 55, tzinfo=UTC)
    with pytest.raises(OutOfRange):
        timing.next_interval_slot(start, timedelta(seconds=10), start)
    with pytest.raises(OutOfRange):
        timing.next_interval_slot(datetime(2026, 1, 1, tzinfo=UTC), timedelta(days=3660), datetime.max.replace(
            tzinfo=UTC) - timedelta(days=1))
    with pytest.raises(OutOfRange):
        timing.interval_slots_fit(timing.LAST_INSTANT - timedelta(days=1), timedelta(hours=7))
    timing.interval_slots_fit(timing.LAST_INSTANT - timedelta(days=1), timedelta(hours=6))
    last = timing.LAST_INSTANT - timedelta(seconds=5)
    assert timing.next_run_after("interval", "10s", ZoneInfo("UTC"), after=last, anchor=last) is None  # ended
    assert timing.next_interval_slot(last, timedelta(seconds=10), last - timedelta(seconds=1)) == last


@pytest.fixture
def core(db_path: Path) -> Iterator[Core]:
    c = Core(make_settings(db_path, http_token=TOKEN), clock=lambda: FIXED_NOW)
    yield c
    c.close()


@pytest.mark.parametrize(("start_at", "zone"), [("9999-12-31T23:59:55Z", None),
                                                 ("9999-12-31 23:00", "Pacific/Kiritimati"),
                                                 ("9999-12-29 13:59:55", "Pacific/Kiritimati")])
def test_every_leaving_the_calendar_is_refused_and_stores_nothing(core: Core, start_at: str, zone: str | None) -> None:
    with pytest.raises(OutOfRange):
        asyncio.run(core.scheduling.schedule_every("p", "10s", start_at=start_at, timezone=zone, agent_id=AGENT,
                                                   skip_validation=True))
    assert asyncio.run(core.scheduling.list_schedules(agent_id=AGENT))["total"] == 0


@contextmanager
def service(core: Core) -> Iterator[TestClient]:
    """The service's routes (REST and console) without its lifespan (no delivery, no MCP session task,
    nothing that waits for a clock that is fixed here), as tests/test_console.py uses them."""
    client = TestClient(build_service_app(core, core.settings, delivery=False), base_url="http://127.0.0.1:8000",
                        headers={"Authorization": f"Bearer {TOKEN}"}, follow_redirects=False)
    try:
        yield client
    finally:
        client.close()


def test_rest_answers_4xx_for_a_start_at_past_the_calendar(core: Core) -> None:
    with service(core) as client:
        r = client.post("/api/schedules/every", json={"prompt": "p", "every": "10s", "agent_id": AGENT,
                                                      "start_at": "9999-12-31T23:59:55Z", "skip_validation": True})
        assert r.status_code == 400 and r.json()["code"] == "out_of_range", r.text
        assert client.get("/api/schedules", params={"agent_id": AGENT}).json()["total"] == 0


def store_bad_row(core: Core) -> int:
    """A row as the report's request left it before the fix: every 10s from 9999-12-31T23:59:55Z, in
    Pacific/Kiritimati (UTC+14), stored directly."""
    at = datetime(9999, 12, 31, 23, 59, 55, tzinfo=UTC)
    return schedules.insert(core.store, ScheduleRow(
        agent_id=AGENT, prompt_text="bad", schedule_type="interval", schedule_value="10s",
        timezone="Pacific/Kiritimati", next_run=at, due_at=at, created_at=FIXED_NOW, updated_at=FIXED_NOW,
        anchor=at)).id


async def test_every_list_survives_a_bad_row_stored_before_the_fix(core: Core,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    await core.scheduling.schedule_cron("good", "every day at 9", agent_id=AGENT, skip_validation=True)
    bad = store_bad_row(core)

    def check(listed: dict[str, Any]) -> None:
        rows = {s["id"]: s for s in listed["schedules"]}
        assert listed["total"] == 2 and len(rows[bad - 1]["upcoming"]) == 5
        assert rows[bad]["upcoming"] == [] and "cannot be computed" in rows[bad]["description"]

    check(dict(await core.scheduling.list_schedules(agent_id=AGENT)))
    with service(core) as client:
        r = client.get("/api/schedules", params={"agent_id": AGENT})
        assert r.status_code == 200, r.text
        check(r.json())
        login = client.post("/console/login", data={"token": TOKEN, "next": "/"})
        assert login.status_code == 303
        for page in ("/", f"/console/schedules/{bad}", f"/console/agents/{AGENT}"):
            assert client.get(page).status_code == 200, page
    async with Client(build_server(core)) as mcp:
        result = await mcp.call_tool("promptyoself_list", {"agent_id": AGENT})
        check(dict(result.structured_content or {}))
    assert await asyncio.to_thread(cli.main, ["list", "--agent-id", AGENT], core=core) == 0  # its own loop
    assert len(json.loads(capsys.readouterr().out)["schedules"]) == 2
