"""The overlap policy (issue 43 point 3), fast tier: the pure verdict (``delivery.overlap.decide``), the
next state of a queued occurrence, and each policy through the same ``Engine`` (``drain_once``), ``attempt`` and
recorder as production on the in-memory store with a fixed clock and a target kept busy on purpose
(``BusyTarget``: its ``running`` answers what the test says). The schedule's stored policy on SQLite
and PostgreSQL, and its previous turn read from each store, are at the end. The real entry points (the
CLI, a worker process, REST and MCP against the fake Letta holding a run ``running``, a webhook that
cannot tell) are in ``tests/test_overlap_e2e.py``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from promptyoself.core.operations import Core
from promptyoself.core.options import ScheduleOptions
from promptyoself.delivery import overlap
from promptyoself.delivery.outcomes import Basis, next_state
from promptyoself.deps import Deps
from promptyoself.errors import InvalidArgument, NotSent
from promptyoself.store.memory import MemoryDeliveryStore
from promptyoself.targets import registry
from promptyoself.targets.base import Fence, Occurrence, PreviousTurn, Receipt, Sent, Watch
from tests import engine_kit
from tests.conftest import make_settings
from tests.engine_kit import T0, Clock, Recording, memory_deps, registered

GRACE = timedelta(hours=24)
MINUTE = timedelta(minutes=1)


# ---- the verdict (pure) --------------------------------------------------------------------------


def test_an_idle_target_or_allow_sends() -> None:
    for policy in ("skip", "queue", "allow"):
        assert overlap.decide(policy, False, already_waiting=False, late=timedelta(0), grace=GRACE,
                              what="x").action == "send"
    assert overlap.decide("allow", True, already_waiting=False, late=timedelta(0), grace=GRACE,
                          what="x").action == "send"


def test_skip_records_why_and_queue_waits_until_the_grace() -> None:
    skip = overlap.decide("skip", True, already_waiting=False, late=timedelta(0), grace=GRACE, what="a turn runs")
    assert skip.action == "skip" and skip.text == ("skipped: a turn runs (overlap=skip); not sent. The schedule "
                                                   "goes on at its next run.")
    wait = overlap.decide("queue", True, already_waiting=False, late=timedelta(0), grace=GRACE, what="a turn runs")
    assert wait.action == "wait" and overlap.waiting(wait.text)
    again = overlap.decide("queue", True, already_waiting=True, late=GRACE, grace=GRACE, what="a turn runs")
    assert again.action == "wait"
    past = overlap.decide("queue", True, already_waiting=True, late=GRACE + MINUTE, grace=GRACE, what="a turn runs")
    assert past.action == "skip" and "past PROMPTYOSELF_MISFIRE_GRACE" in (past.text or "")
    assert not overlap.waiting(past.text) and not overlap.waiting(None)


def test_a_queued_occurrence_keeps_its_slot_and_is_due_again_after_the_poll() -> None:
    basis = Basis("active", "interval", "1m", "UTC", T0, T0, 3, None, "latest")
    change = next_state(basis, "queued", T0, T0, 1, "queued: busy", 5.0)
    assert change["due_at"] == T0 + timedelta(seconds=5) and change["last_error"] == "queued: busy"
    assert "next_run" not in change and "attempt" not in change and "repetition_count" not in change
    skipped = next_state(basis, "skipped", T0, T0, 1, "skipped: busy", None)
    assert skipped["next_run"] == T0 + MINUTE and "repetition_count" not in skipped
    # catch_up=all goes on at the slot after the claimed one; after a wait, after now (the due ones were skipped)
    every = Basis("active", "interval", "1m", "UTC", T0, T0, 0, None, "all")
    late = T0 + timedelta(minutes=3, seconds=30)
    assert next_state(every, "delivered", late, late, 1, None, None)["next_run"] == T0 + MINUTE
    assert next_state(every, "delivered", late, late, 1, None, None, after_now=True)["next_run"] == \
        T0 + timedelta(minutes=4)


def test_a_target_that_cannot_tell_is_said_in_the_description() -> None:
    assert registry.overlap_note("skip", "webhook") == (
        "overlap=skip asked, but the webhook target cannot tell whether a turn is still running: sent anyway "
        "(as allow)")
    assert registry.overlap_note("allow", "webhook") is None and registry.overlap_note(None, "webhook") is None
    assert registry.overlap_note("skip", "letta") is None
    assert [registry.overlap_policy(None, t) for t in ("letta", "letta-code", "claude-code", "webhook", "codex")] == \
        ["allow", "queue", "queue", "allow", "allow"]
    assert registry.overlap_policy("skip", "claude-code") == "skip"


# ---- each policy through the engine -------------------------------------------------------------


class BusyTarget(Recording):
    """A target kept busy on purpose: ``busy`` is what ``running`` answers; it keeps what it received
    and the previous turns it was asked about."""

    name = "busy"

    def __init__(self) -> None:
        self.busy = False
        self.received: list[str] = []
        self.asked: list[PreviousTurn | None] = []
        self._lock = threading.Lock()

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        if not fence():
            raise NotSent("fenced")
        with self._lock:
            self.received.append(occ.occurrence_id)
        return Sent(route="fake", run_id=f"run-{len(self.received)}", receipt=Receipt.none("no receipt here"))

    async def running(self, occ: Occurrence, previous: PreviousTurn | None) -> bool:
        self.asked.append(previous)
        return self.busy


@pytest.fixture
def target() -> Iterator[BusyTarget]:
    with registered("busy", BusyTarget()) as fake:
        yield fake


@pytest.fixture
def clock() -> Clock:
    return Clock()


def drain(deps: Deps) -> list[str]:
    return [r.outcome for r in engine_kit.drain(deps)]


def every_minute(mem: MemoryDeliveryStore, policy: str | None, target: str = "busy") -> int:
    return mem.add("agent-a", "p", T0, target=target, schedule_type="interval", schedule_value="1m", anchor=T0,
                   overlap=policy)


def test_skip_records_the_occurrence_skipped_and_moves_on(tmp_path: Path, target: BusyTarget, clock: Clock) -> None:
    deps, mem = memory_deps(tmp_path, clock)
    sid = every_minute(mem, "skip")
    assert drain(deps) == ["delivered"] and target.asked == [None]  # no previous turn yet
    target.busy = True
    clock.now = T0 + MINUTE
    assert drain(deps) == ["skipped"]
    row = mem.get(sid)
    assert row.next_run == T0 + 2 * MINUTE and row.state == "active" and row.repetition_count == 1
    assert (row.last_error or "").startswith("skipped: a turn is still running at the busy target (run run-1)")
    assert target.asked[-1] is not None and target.asked[-1].run_id == "run-1"
    assert target.asked[-1].receipt is not None and target.asked[-1].receipt.state == "none"
    target.busy = False
    clock.now = T0 + 2 * MINUTE
    assert drain(deps) == ["delivered"]
    assert mem.outcomes(sid) == ["delivered", "skipped", "delivered"] and len(target.received) == 2
    skipped = [h for h in mem.history if h["outcome"] == "skipped"]
    assert skipped[0]["scheduled_for"] == T0 + MINUTE and "overlap=skip" in skipped[0]["error"]


def test_queue_waits_for_the_turn_once_and_skips_what_came_due_meanwhile(tmp_path: Path, target: BusyTarget,
                                                                         clock: Clock) -> None:
    deps, mem = memory_deps(tmp_path, clock)
    sid = every_minute(mem, "queue")
    assert drain(deps) == ["delivered"]
    target.busy = True
    clock.now = T0 + MINUTE
    assert drain(deps) == ["queued"]
    row = mem.get(sid)
    assert row.next_run == T0 + MINUTE and row.due_at == T0 + MINUTE + timedelta(seconds=5)  # its slot kept
    assert overlap.waiting(row.last_error) and row.claimed_by is None
    for seconds in (5, 10, 70, 130):  # still running: asked again every poll, recorded once; later slots come due
        clock.now = T0 + MINUTE + timedelta(seconds=seconds)
        assert drain(deps) == ["queued"]
    assert mem.outcomes(sid) == ["delivered", "queued"] and len(target.received) == 1
    assert mem.get(sid).next_run == T0 + MINUTE
    target.busy = False  # the turn ended: the waiting one is sent, the two that came due meanwhile skipped
    clock.now = T0 + MINUTE + timedelta(seconds=135)
    assert drain(deps) == ["delivered"]
    assert mem.outcomes(sid) == ["delivered", "queued", "delivered", "skipped", "skipped"]
    assert len(target.received) == 2
    skipped = [h for h in mem.history if h["outcome"] == "skipped"]
    assert [h["scheduled_for"] for h in skipped] == [T0 + 2 * MINUTE, T0 + 3 * MINUTE]
    assert all("overlap=queue: at most one waits" in h["error"] for h in skipped)
    row = mem.get(sid)
    assert row.next_run == T0 + 4 * MINUTE and row.last_error is None and row.repetition_count == 2


def test_queue_with_catch_up_all_still_lets_one_wait(tmp_path: Path, target: BusyTarget, clock: Clock) -> None:
    deps, mem = memory_deps(tmp_path, clock)
    sid = mem.add("agent-a", "p", T0, target="busy", schedule_type="interval", schedule_value="1m", anchor=T0,
                  overlap="queue", catch_up="all")
    target.busy = True
    assert drain(deps) == ["queued"]
    clock.now = T0 + timedelta(minutes=2, seconds=30)
    target.busy = False
    assert drain(deps) == ["delivered"]
    assert mem.outcomes(sid) == ["queued", "delivered", "skipped", "skipped"]
    assert mem.get(sid).next_run == T0 + 3 * MINUTE and len(target.received) == 1


def test_a_waiting_occurrence_past_the_misfire_grace_is_skipped(tmp_path: Path, target: BusyTarget,
                                                                clock: Clock) -> None:
    deps, mem = memory_deps(tmp_path, clock, misfire_grace="10m")
    sid = mem.add("agent-a", "p", T0, target="busy", schedule_type="interval", schedule_value="1h", anchor=T0,
                  overlap="queue")
    target.busy = True
    assert drain(deps) == ["queued"]
    clock.now = T0 + timedelta(minutes=11)
    assert drain(deps) == ["skipped"]
    row = mem.get(sid)
    assert row.next_run == T0 + timedelta(hours=1) and not overlap.waiting(row.last_error)
    assert mem.outcomes(sid) == ["queued", "skipped"] and target.received == []


def test_allow_sends_anyway_and_never_asks(tmp_path: Path, target: BusyTarget, clock: Clock) -> None:
    deps, mem = memory_deps(tmp_path, clock)
    sid = every_minute(mem, "allow")
    target.busy = True
    assert drain(deps) == ["delivered"]
    clock.now = T0 + MINUTE
    assert drain(deps) == ["delivered"]
    assert mem.outcomes(sid) == ["delivered", "delivered"] and target.asked == []


class BlindTarget(BusyTarget):
    """The same target without ``running``: it cannot tell."""

    running = None  # type: ignore[assignment]


def test_a_target_that_cannot_tell_sends_as_allow(tmp_path: Path, clock: Clock) -> None:
    blind = BlindTarget()
    registry.register("blind", lambda _settings: blind)
    try:
        deps, mem = memory_deps(tmp_path, clock)
        sid = every_minute(mem, "skip", target="blind")
        assert drain(deps) == ["delivered"]
        clock.now = T0 + MINUTE
        assert drain(deps) == ["delivered"]
        assert mem.outcomes(sid) == ["delivered", "delivered"]
    finally:
        registry.unregister("blind")


def test_a_busy_check_that_fails_is_retried_like_a_send(tmp_path: Path, target: BusyTarget, clock: Clock) -> None:
    from promptyoself.errors import TargetUnavailable

    async def down(occ: Occurrence, previous: PreviousTurn | None) -> bool:
        raise TargetUnavailable("cannot ask", transient=True, in_doubt=False)

    target.running = down  # type: ignore[method-assign]
    deps, mem = memory_deps(tmp_path, clock)
    sid = every_minute(mem, "skip")
    assert drain(deps) == ["retry"] and target.received == []
    assert mem.get(sid).next_run == T0


# ---- the stored policy (SQLite and PostgreSQL) ---------------------------------------------------


class BusyPlugin:
    """An outside plug-in that declares a busy check and a default policy (``TargetPlugin``)."""

    name = "busy"
    summary = "a target kept busy on purpose"
    aliases: tuple[str, ...] = ()
    default_overlap = "skip"
    busy_check = "the test says so"

    def __init__(self, target: BusyTarget) -> None:
        from pydantic import BaseModel, ConfigDict

        class NoOptions(BaseModel):
            model_config = ConfigDict(extra="forbid", frozen=True)

        self.options = NoOptions
        self.target = target

    def claims(self, call: Any) -> bool:
        return False

    def destination(self, call: Any) -> Any:
        from promptyoself.targets.base import Destination

        return Destination(call.agent())

    def validate(self, core: Any, agent_id: str) -> None:
        return None

    def create(self, settings: Any) -> Any:
        return self.target

    def watch(self, settings: Any) -> Watch:
        return Watch("target_unreachable", "nothing to fix")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "overlap.db")
    return str(request.getfixturevalue("pg_url"))


def test_the_policy_is_stored_defaulted_listed_and_compared(db_url: str, target: BusyTarget,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_URL", "http://127.0.0.1:9/hook")
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_SECRET", "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=")
    registry.register("busy", BusyPlugin(target))
    core = Core(make_settings(db_url))
    try:
        made = asyncio.run(core.scheduling.schedule_every("p", "1h", ScheduleOptions.of({"agent_id": "agent-a",
                                                                                         "target": "busy",
                                                                  "skip_validation": True})))
        assert made["overlap"] == "skip"  # the plug-in's default, stored with the schedule
        hook = asyncio.run(core.scheduling.schedule_every("p", "1h", ScheduleOptions.of({"agent_id": "agent-a",
                                                                                         "target": "webhook",
                                                                  "endpoint": "default", "overlap": "queue",
                                                                  "skip_validation": True})))
        assert hook["overlap"] == "queue" and "cannot tell whether a turn is still running" in hook["description"]
        keyed = {"agent_id": "agent-a", "target": "busy", "skip_validation": True, "idempotency_key": "k"}
        first = asyncio.run(core.scheduling.schedule_every("p", "1h", ScheduleOptions.of({**keyed,
                                                                                          "overlap": "allow"})))
        same = asyncio.run(core.scheduling.schedule_every("p", "1h", ScheduleOptions.of(keyed)))
        assert same["deduplicated"]  # none named: the same
        with pytest.raises(Exception, match="overlap"):
            asyncio.run(core.scheduling.schedule_every("p", "1h", ScheduleOptions.of({**keyed, "overlap": "queue"})))
        listed = {s["id"]: s for s in asyncio.run(core.scheduling.list_schedules(agent_id="agent-a"))["schedules"]}
        assert [listed[i]["overlap"] for i in (made["id"], hook["id"], first["id"])] == ["skip", "queue", "allow"]
        assert "cannot tell" not in listed[made["id"]]["description"]
        page = asyncio.run(core.operator.console_schedules(agent_id="agent-a"))
        rules = {v["schedule"]["id"]: v["rule"] for v in page["schedules"]}
        assert rules[made["id"]].endswith("; overlap skip") and "overlap" not in rules[first["id"]]  # allow
        shown = asyncio.run(core.operator.console_schedule(made["id"]))  # the console's schedule page
        assert "overlap skip" in shown["rule"]
        assert rules[hook["id"]].count("overlap") == 1  # its description says it already
        with pytest.raises(InvalidArgument, match="overlap"):
            ScheduleOptions.of({"overlap": "sometimes"})
        with pytest.raises(InvalidArgument, match="overlap must be"):
            asyncio.run(core.scheduling.schedule_every("p", "1h", agent_id="agent-a", target="busy",
                                                       skip_validation=True, overlap="never"))
        targets = {t["name"]: t for t in asyncio.run(core.targets())["targets"]}
        assert (targets["busy"]["overlap"], targets["busy"]["busy_check"]) == ("skip", "the test says so")
        assert (targets["webhook"]["overlap"], targets["webhook"]["busy_check"]) == ("allow", None)
        assert targets["claude-code"]["overlap"] == "queue" and targets["claude-code"]["busy_check"]
    finally:
        core.close()


def test_the_previous_turn_is_read_from_the_store(db_url: str, target: BusyTarget) -> None:
    """The engine on the database's store: the previous turn ``running`` is asked about is the newest
    delivered row (its run and receipt), and a queued wait is recorded once."""
    registry.register("busy", BusyPlugin(target))
    clock = Clock()
    core = Core(make_settings(db_url), clock=clock)
    try:
        opts = ScheduleOptions.of({"agent_id": "agent-a", "target": "busy", "skip_validation": True,
                                   "overlap": "queue"})
        sid = asyncio.run(core.scheduling.schedule_every("p", "1m", opts, start_at="2026-06-15T12:01:00Z"))["id"]
        assert asyncio.run(core.deliveries.last_turn(sid)) is None
        clock.now = T0 + MINUTE
        assert drain(core) == ["delivered"]
        last = asyncio.run(core.deliveries.last_turn(sid))
        assert last is not None and last.run_id == "run-1" and Receipt.from_json(last.receipt) is not None
        target.busy = True
        clock.now = T0 + 2 * MINUTE
        assert drain(core) == ["queued"]
        clock.now = T0 + 2 * MINUTE + timedelta(seconds=5)
        assert drain(core) == ["queued"]
        target.busy = False
        clock.now = T0 + 2 * MINUTE + timedelta(seconds=10)
        assert drain(core) == ["delivered"]
        outcomes = [d["outcome"] for d in reversed(asyncio.run(core.scheduling.history(schedule_id=sid))["deliveries"])]
        assert outcomes == ["delivered", "queued", "delivered"]
        assert target.asked[0] is None and target.asked[1] is not None and target.asked[1].run_id == "run-1"
        assert asyncio.run(core.deliveries.last_turn(sid)).run_id == "run-2"  # type: ignore[union-attr]
    finally:
        core.close()


def test_previous_turn_of_letta_is_its_run(tmp_path: Path) -> None:
    """Letta's busy check asks the run only when the previous turn named one and it was not read whole."""
    from promptyoself.targets.letta.target import LettaRestTarget

    class Runs:
        def __init__(self) -> None:
            self.asked: list[str] = []

        async def run_running(self, run_id: str) -> bool:
            self.asked.append(run_id)
            return True

    runs = Runs()
    t = LettaRestTarget(make_settings(str(tmp_path / "x.db")), client=runs)  # type: ignore[arg-type]
    occ = Occurrence(1, "o", "agent-a", "t", "t", T0)
    at = T0
    assert asyncio.run(t.running(occ, None)) is False
    assert asyncio.run(t.running(occ, PreviousTurn(None, at))) is False
    assert asyncio.run(t.running(occ, PreviousTurn("run-1", at, Receipt(state="complete")))) is False
    assert asyncio.run(t.running(occ, PreviousTurn("run-2", at, Receipt(state="pending")))) is True
    assert runs.asked == ["run-2"]


async def test_the_policy_is_changed_through_mcp_rest_and_the_cli(db_url: str, target: BusyTarget,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from fastapi.testclient import TestClient
    from fastmcp import Client

    from promptyoself.faces.cli import main
    from promptyoself.faces.mcp import build_server
    from promptyoself.faces.rest import build_rest_app

    registry.register("busy", BusyPlugin(target))
    core = Core(make_settings(db_url, http_token="overlap-token"))
    try:
        opts = ScheduleOptions.of({"agent_id": "agent-a", "target": "busy", "skip_validation": True})
        sid = (await core.scheduling.schedule_every("p", "1h", opts))["id"]
        async with Client(build_server(core)) as client:
            got = await client.call_tool("promptyoself_set_overlap", {"schedule_id": sid, "overlap": "queue"})
            assert json.loads(got.content[0].text)["overlap"] == "queue"
            bad = await client.call_tool("promptyoself_set_overlap", {"schedule_id": sid, "overlap": "never"},
                                         raise_on_error=False)
            assert bad.is_error and "overlap" in bad.content[0].text
        with TestClient(build_rest_app(core), headers={"Authorization": "Bearer overlap-token"}) as rest:
            ok = rest.post(f"/api/schedules/{sid}/overlap", json={"overlap": "allow"})
            assert ok.status_code == 200 and ok.json()["overlap"] == "allow", ok.text
            assert rest.post(f"/api/schedules/{sid}/overlap", json={"overlap": "never"}).status_code in (400, 422)
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["--json", "overlap", str(sid), "skip"], core=core) == 0  # its own loop
        assert json.loads(capsys.readouterr().out)["overlap"] == "skip"
        [row] = (await core.scheduling.list_schedules(agent_id="agent-a"))["schedules"]
        assert row["overlap"] == "skip"
        await core.scheduling.cancel(sid)
        with pytest.raises(InvalidArgument, match="only a live schedule"):
            await core.scheduling.set_overlap(sid, "queue")
    finally:
        core.close()
