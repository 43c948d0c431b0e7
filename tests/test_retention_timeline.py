"""Retention (``core/retention.py``) and the console's timeline (``core/timeline.py``) on the one async
store interface, run on the in-memory store, SQLite and PostgreSQL alike (as ``test_operator_memory.py``):
each case is the same test with the same expected values on each, in the fast tier, with a fixed
``now`` through the ``Deps`` clock. What is purged and what is kept (``HISTORY_FLOOR`` and the misfire
grace included), the timeline's runs, counts and truncation. On memory nothing opens the database
(the ``make`` fixture checks)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from promptyoself import timing
from promptyoself.core import timeline
from promptyoself.core.operations import Core
from promptyoself.core.retention import HISTORY_FLOOR, purge
from promptyoself.core.timeline import recent_deliveries, upcoming_runs
from promptyoself.errors import InvalidArgument
from promptyoself.store.db import Delivery
from promptyoself.store.memory import MemoryDeliveryStore
from tests.engine_kit import T0, Clock

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


def opts(agent: str = "agent-a", **extra: Any) -> dict[str, Any]:
    return {"agent_id": agent, "skip_validation": True, **extra}


def add_history(core: Core, schedule_id: int, agent: str, at: datetime, outcome: str = "delivered") -> None:
    """A history row as delivery records it, on whichever store ``core`` has (written in time order:
    history ids grow with time, which the SQL read of the timeline relies on)."""
    columns: dict[str, Any] = {"schedule_id": schedule_id, "agent_id": agent, "scheduled_for": at,
                               "attempted_at": at, "outcome": outcome, "attempt": 1}
    if isinstance(core.deliveries, MemoryDeliveryStore):
        core.deliveries.add_history(**columns)
        return
    with core.store.session() as s:
        s.add(Delivery(**columns))


async def history_left(core: Core) -> list[tuple[int, datetime]]:
    """``(schedule_id, attempted_at)`` of every history row left, newest first."""
    rows = await core.deliveries.deliveries(schedule_id=None, agent_id=None, limit=100)
    return [(r.schedule_id, r.attempted_at) for r in rows]


async def ended(core: Core, clock: Clock, at: datetime, agent: str = "agent-b") -> int:
    """A schedule made and cancelled at ``at`` (its last change)."""
    clock.now = at
    sid = int((await core.scheduling.schedule_time("ends", "in 5m", **opts(agent)))["id"])
    await core.scheduling.cancel(sid)
    return sid


# ---- retention --------------------------------------------------------------------------------------


async def test_purge_by_the_settings_deletes_what_ended_and_what_aged(make: Any, clock: Clock) -> None:
    core = make()  # PROMPTYOSELF_KEEP_ENDED 7d, PROMPTYOSELF_KEEP_HISTORY 30d
    clock.now = T0 - 40 * DAY
    live = int((await core.scheduling.schedule_every("live", "1h", **opts()))["id"])
    paused = int((await core.scheduling.schedule_every("paused", "1h", **opts("agent-c")))["id"])
    await core.scheduling.pause(paused)  # paused 40 days ago, but live: never purged
    add_history(core, live, "agent-a", T0 - 40 * DAY)  # older than 30 days: goes
    gone = await ended(core, clock, T0 - 10 * DAY)  # ended 10 days ago: goes, with its history
    add_history(core, gone, "agent-b", T0 - 10 * DAY + HOUR)
    kept = await ended(core, clock, T0 - 3 * DAY)  # ended 3 days ago: kept, with its history
    add_history(core, kept, "agent-b", T0 - 3 * DAY + HOUR)
    add_history(core, live, "agent-a", T0 - DAY)
    clock.now = T0
    done = await purge(core)
    assert done == {"status": "success", "schedules": 1, "history": 2, "passthrough_sends": 0,
                    "ended_before": timing.to_utc_iso(T0 - 7 * DAY),
                    "history_before": timing.to_utc_iso(T0 - 30 * DAY)}
    assert await core.deliveries.schedule(gone) is None
    for sid in (live, paused, kept):
        assert await core.deliveries.schedule(sid) is not None
    assert await history_left(core) == [(live, T0 - DAY), (kept, T0 - 3 * DAY + HOUR)]
    again = await purge(core)
    assert (again["schedules"], again["history"]) == (0, 0), "nothing more to purge"


async def test_history_within_the_floor_is_kept_whatever_the_cut_off(make: Any, clock: Clock) -> None:
    """``--before 1h``: ended schedules older than an hour go, with all their history; other history
    only beyond ``HISTORY_FLOOR`` (2 days; the day's budget and an occurrence's retries read it)."""
    core = make(keep_history="1h")
    clock.now = T0 - 5 * DAY
    live = int((await core.scheduling.schedule_every("live", "1h", **opts()))["id"])
    for age in (3 * DAY, HISTORY_FLOOR + timedelta(minutes=1), HISTORY_FLOOR, DAY, timedelta(minutes=30)):
        add_history(core, live, "agent-a", T0 - age)
    gone = await ended(core, clock, T0 - 2 * HOUR)
    add_history(core, gone, "agent-b", T0 - timedelta(minutes=90))  # within the floor, but its schedule goes
    clock.now = T0
    done = await purge(core, before="1h")
    assert done["ended_before"] == timing.to_utc_iso(T0 - HOUR)
    assert done["history_before"] == timing.to_utc_iso(T0 - HISTORY_FLOOR)
    assert (done["schedules"], done["history"]) == (1, 3)
    assert await core.deliveries.schedule(gone) is None
    assert await history_left(core) == [(live, T0 - timedelta(minutes=30)), (live, T0 - DAY),
                                        (live, T0 - HISTORY_FLOOR)]
    by_settings = await purge(core)  # PROMPTYOSELF_KEEP_HISTORY 1h: floored the same way
    assert by_settings["history_before"] == timing.to_utc_iso(T0 - HISTORY_FLOOR) and by_settings["history"] == 0


async def test_a_longer_misfire_grace_raises_the_floor(make: Any, clock: Clock) -> None:
    core = make(keep_history="1h", misfire_grace="3d")
    live = int((await core.scheduling.schedule_every("live", "1h", **opts()))["id"])
    for age in (4 * DAY, 3 * DAY + HOUR, 3 * DAY, 2 * DAY + HOUR):
        add_history(core, live, "agent-a", T0 - age)
    done = await purge(core)
    assert done["history_before"] == timing.to_utc_iso(T0 - 3 * DAY) and done["history"] == 2
    assert await history_left(core) == [(live, T0 - 2 * DAY - HOUR), (live, T0 - 3 * DAY)]


async def test_retention_off_keeps_everything(make: Any, clock: Clock) -> None:
    core = make(keep_ended="off", keep_history="off")
    old = await ended(core, clock, T0 - 400 * DAY)
    add_history(core, old, "agent-b", T0 - 400 * DAY)
    clock.now = T0
    done = await purge(core)
    assert (done["schedules"], done["history"], done["ended_before"], done["history_before"]) == (0, 0, None, None)
    assert await core.deliveries.schedule(old) is not None and len(await history_left(core)) == 1


async def test_a_cut_off_in_the_future_or_unreadable_is_refused(make: Any, clock: Clock) -> None:
    core = make()
    old = await ended(core, clock, T0 - 30 * DAY)
    clock.now = T0
    for before in ("2999-01-01", "soon", ""):
        with pytest.raises(InvalidArgument):
            await purge(core, before=before)
    assert await core.deliveries.schedule(old) is not None, "nothing purged"
    assert (await purge(core, before="2026-06-01"))["schedules"] == 1  # an ISO date: UTC midnight


# ---- the timeline -----------------------------------------------------------------------------------


async def week(core: Core) -> dict[str, int]:
    """T0 is Monday 2026-06-15 12:00 UTC; the window runs to Monday 22nd 12:00."""
    made = {}
    made["a"] = (await core.scheduling.schedule_cron("daily", "0 13 * * *", **opts("agent-a")))["id"]  # 7 runs
    made["b"] = (await core.scheduling.schedule_cron("weekdays", "30 9 * * MON-FRI", **opts("agent-b")))["id"]  # 5
    made["c"] = (await core.scheduling.schedule_time("once", "2026-06-17T12:00:00Z", **opts("agent-c")))["id"]
    made["e"] = (await core.scheduling.schedule_every("flood", "10s", **opts("agent-e")))["id"]  # one band
    made["later"] = (await core.scheduling.schedule_time("next week", "2026-06-23T12:00:00Z",
                                                         **opts("agent-f")))["id"]  # after the window: not read
    paused = await core.scheduling.schedule_cron("paused", "0 * * * *", **opts("agent-d"))
    await core.scheduling.pause(paused["id"])
    cancelled = await core.scheduling.schedule_cron("cancelled", "0 * * * *", **opts("agent-d"))
    await core.scheduling.cancel(cancelled["id"])
    return {k: int(v) for k, v in made.items()}


def shape(up: timeline.Upcoming) -> list[tuple[str, int, int, int, int]]:
    return [(a["agent_id"], a["schedules"], len(a["runs"]), len(a["bands"]), a["hidden_runs"]) for a in up["agents"]]


async def test_the_upcoming_runs_of_the_next_week(make: Any) -> None:
    core = make()
    made = await week(core)
    up = await upcoming_runs(core, T0)
    assert (up["start"], up["end"], up["truncated"], up["hidden_agents"]) == (T0, T0 + 7 * DAY, False, 0)
    assert shape(up) == [("agent-a", 1, 7, 0, 0), ("agent-b", 1, 5, 0, 0), ("agent-c", 1, 1, 0, 0),
                         ("agent-e", 1, 0, 1, 0)]
    a, _, c, e = up["agents"]
    assert [r["at"] for r in a["runs"]] == [T0 + HOUR + i * DAY for i in range(7)]
    assert {r["schedule_id"] for r in a["runs"]} == {made["a"]}
    assert [r["at"] for r in c["runs"]] == [datetime(2026, 6, 17, 12, tzinfo=UTC)]
    assert e["bands"] == [{"start": T0 + timedelta(seconds=10), "schedule_id": made["e"]}]
    one = await upcoming_runs(core, T0, "agent-b")
    assert shape(one) == [("agent-b", 1, 5, 0, 0)]
    assert [r["at"] for r in one["agents"][0]["runs"]][-1] == datetime(2026, 6, 22, 9, 30, tzinfo=UTC)
    assert (await upcoming_runs(core, T0, "nobody"))["agents"] == []


async def test_the_upcoming_runs_are_bounded(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    core = make()
    await week(core)
    monkeypatch.setattr(timeline, "MAX_SCHEDULES", 2)  # the soonest due: agent-e (10 s), agent-a (13:00)
    up = await upcoming_runs(core, T0)
    assert up["truncated"] and shape(up) == [("agent-a", 1, 7, 0, 0), ("agent-e", 1, 0, 1, 0)]
    monkeypatch.setattr(timeline, "MAX_SCHEDULES", 4)
    monkeypatch.setattr(timeline, "MAX_AGENTS", 2)
    monkeypatch.setattr(timeline, "MAX_RUNS", 3)
    up = await upcoming_runs(core, T0)
    assert not up["truncated"] and up["hidden_agents"] == 2
    assert shape(up) == [("agent-a", 1, 3, 0, 4), ("agent-b", 1, 3, 0, 2)]
    assert [r["at"] for r in up["agents"][0]["runs"]] == [T0 + HOUR + i * DAY for i in range(3)], "the soonest"


async def recent_history(core: Core) -> None:
    a = (await core.scheduling.schedule_every("a", "1h", **opts("agent-a")))["id"]
    b = (await core.scheduling.schedule_every("b", "1h", **opts("agent-b")))["id"]
    for hours_ago, outcome, sid, agent in ((30, "missed", a, "agent-a"),  # before the 24 hours: not counted
                                           (5.3, "delivered", b, "agent-b"),  # 06:00-07:00
                                           (5.2, "delivered", b, "agent-b"),
                                           (0.6, "failed", a, "agent-a"),  # 11:00-12:00
                                           (0.5, "delivered", a, "agent-a"), (0.5, "delivered", a, "agent-a"),
                                           (0.5, "delivered", a, "agent-a"),
                                           (0, "retry", a, "agent-a")):  # 12:00, the current hour
        add_history(core, int(sid), agent, T0 - timedelta(hours=hours_ago), outcome)


async def test_the_deliveries_of_the_last_24_hours(make: Any) -> None:
    core = make()
    await recent_history(core)
    recent = await recent_deliveries(core, T0 + timedelta(minutes=20))
    assert (recent["start"], recent["end"], recent["truncated"]) == (T0 - 23 * HOUR, T0 + HOUR, False)
    assert recent["total"] == {"delivered": 5, "failed": 1, "retry": 1}
    counted = {i: h["counts"] for i, h in enumerate(recent["hours"]) if h["counts"]}
    assert counted == {17: {"delivered": 2}, 22: {"failed": 1, "delivered": 3}, 23: {"retry": 1}}
    assert recent["hours"][17]["start"] == T0 - 6 * HOUR and len(recent["hours"]) == 24
    b = await recent_deliveries(core, T0, "agent-b")
    assert b["total"] == {"delivered": 2} and not b["truncated"]
    assert (await recent_deliveries(core, T0, "nobody"))["total"] == {}


async def test_the_deliveries_counted_are_bounded(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    core = make()
    await recent_history(core)
    monkeypatch.setattr(timeline, "MAX_ATTEMPTS", 3)  # the oldest three since the window's start
    recent = await recent_deliveries(core, T0)
    assert recent["truncated"] and recent["total"] == {"delivered": 2, "failed": 1}
    monkeypatch.setattr(timeline, "MAX_ATTEMPTS", 7)  # exactly what there is: not truncated
    assert not (await recent_deliveries(core, T0))["truncated"]
