"""Failure alerts and auto-pause (issue 43 point 4), in the fast tier: the pure decision
(``outcomes.next_state``), whole scenarios on the in-memory store with a fake clock through the real
``Engine`` (failures in a row pause a schedule and raise one alert; an agent's first prompt held by
its budget in a day; a target's outage), the SQL table's verbs, the signed POST (``AlertSender``
through ``httpx.MockTransport``, verified by the ``standardwebhooks`` reference), the policy value,
``/metrics`` and the console's banner. The end-to-end run through a real worker process is in
``tests/test_alerts_e2e.py``."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from promptyoself.config import ConfigError, Settings, load_settings
from promptyoself.delivery import alerts as delivery_alerts
from promptyoself.delivery.alerts import AlertSender
from promptyoself.delivery.outcomes import Basis, next_state
from promptyoself.delivery.service import drain_once
from promptyoself.deps import Deps
from promptyoself.errors import NotSent, TargetRejected, TargetUnavailable
from promptyoself.store import alerts as stored_alerts
from promptyoself.store.db import Store
from promptyoself.store.memory import MemoryDeliveryStore
from promptyoself.targets.base import Fence, Found, Occurrence, Sent
from tests.engine_kit import T0, Clock, drain, memory_deps, registered

SECRET = "whsec_" + base64.b64encode(b"the-alert-secret-of-the-operator").decode()


class Target:
    """``mode``: ``ok`` (delivered), ``reject`` (TargetRejected: the occurrence fails), ``down``
    (TargetUnavailable, before writing)."""

    name = "alerting"

    def __init__(self) -> None:
        self.mode = "ok"
        self.received: list[str] = []
        self._lock = threading.Lock()

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        if self.mode == "down":
            raise TargetUnavailable("the fake is down", transient=True, in_doubt=False)
        if not fence():
            raise NotSent("fenced")
        if self.mode == "reject":
            raise TargetRejected("the fake refuses this prompt")
        with self._lock:
            self.received.append(occ.occurrence_id)
        return Sent(route="fake", run_id=None)

    async def lookup(self, occ: Occurrence) -> Found:
        return Found("found" if occ.occurrence_id in self.received else "absent")

    async def probe(self) -> None:
        if self.mode == "down":
            raise TargetUnavailable("the fake is down")

    def readiness(self) -> str:
        return "fake"

    async def aclose(self) -> None:
        return None


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def target() -> Iterator[Target]:
    with registered("alerting", Target()) as fake:
        yield fake


def deps_for(tmp_path: Path, clock: Clock, **settings: Any) -> tuple[Deps, MemoryDeliveryStore]:
    """The kit's memory store, a failed attempt final (``max_attempts`` 1) unless a test says otherwise."""
    return memory_deps(tmp_path, clock, **{"max_attempts": 1, **settings})


# ---- the decision (pure) ---------------------------------------------------------------------------


def basis(failures: int = 0, state: str = "active", kind: str = "interval") -> Basis:
    return Basis(state, kind, "60" if kind == "interval" else "x", "UTC", T0, T0, 3, None, "latest", failures)


def test_failures_in_a_row_are_counted_and_the_nth_pauses() -> None:
    after = next_state(basis(0), "failed", T0, T0, 1, "target_rejected: no", None, pause_after=5)
    assert after["failures_in_row"] == 1 and "state" not in after and after["due_at"] is not None
    after = next_state(basis(3), "failed", T0, T0, 1, "target_rejected: no", None, pause_after=5)
    assert after["failures_in_row"] == 4 and "state" not in after
    paused = next_state(basis(4), "failed", T0, T0, 1, "target_rejected: no", None, pause_after=5)
    assert paused["state"] == "paused" and paused["due_at"] is None and paused["failures_in_row"] == 0
    assert paused["last_error"].startswith("paused: 5 occurrences in a row failed")
    assert "pause_after_failures=5" in paused["last_error"] and "target_rejected: no" in paused["last_error"]


def test_a_delivery_starts_the_count_again_and_other_outcomes_leave_it() -> None:
    assert next_state(basis(4), "delivered", T0, T0, 1, None, None, pause_after=5)["failures_in_row"] == 0
    assert "failures_in_row" not in next_state(basis(0), "delivered", T0, T0, 1, None, None, pause_after=5)
    for kind in ("missed", "over_budget", "retry"):
        assert "failures_in_row" not in next_state(basis(4), kind, T0, T0, 1, "x", 5.0, pause_after=5)


def test_zero_never_pauses_and_a_one_time_prompt_just_fails() -> None:
    assert "state" not in next_state(basis(99), "failed", T0, T0, 1, "x", None, pause_after=0)
    once = next_state(basis(4, kind="once"), "failed", T0, T0, 1, "x", None, pause_after=5)
    assert once["state"] == "failed"
    paused_already = next_state(basis(4, state="paused"), "failed", T0, T0, 1, "x", None, pause_after=5)
    assert paused_already["failures_in_row"] == 5  # a person paused it meanwhile: counted, not re-paused
    assert "paused: " not in (paused_already.get("last_error") or "")


def test_alerts_for_an_outcome() -> None:
    rules = delivery_alerts.AlertRules(5, "2026-06-15")
    paused = {"state": "paused", "last_error": "paused: 5 ..."}
    [a] = delivery_alerts.for_outcome(7, "agent-a", "letta", "failed", T0, "active", paused, rules, T0)
    assert a["kind"] == "schedule_paused" and a["schedule_id"] == 7 and "paused: 5" in a["message"]
    assert delivery_alerts.for_outcome(7, "agent-a", "letta", "failed", T0, "paused", paused, rules, T0) == ()
    one = delivery_alerts.for_outcome(7, "agent-a", "letta", "over_budget", T0, "active", {}, rules, T0)
    two = delivery_alerts.for_outcome(8, "agent-a", "letta", "over_budget", T0 + timedelta(hours=1), "active", {},
                                      rules, T0)
    assert one[0]["id"] == two[0]["id"]  # one per agent per budget day
    other_day = delivery_alerts.for_outcome(7, "agent-a", "letta", "over_budget", T0, "active", {},
                                            delivery_alerts.AlertRules(5, "2026-06-16"), T0)
    assert other_day[0]["id"] != one[0]["id"]


# ---- whole scenarios on the in-memory store --------------------------------------------------------


def test_five_failures_in_a_row_pause_the_schedule_and_raise_one_alert(
        tmp_path: Path, target: Target, clock: Clock) -> None:
    deps, mem = deps_for(tmp_path, clock)
    target.mode = "reject"
    sid = mem.add("agent-a", "p", T0, target="alerting", schedule_type="interval", schedule_value="60", anchor=T0)
    for n in range(1, 6):
        drain(deps)
        row = mem.get(sid)
        assert mem.outcomes(sid).count("failed") == n
        if n < 5:
            assert row.state == "active" and row.failures_in_row == n and not mem.alerts
            clock.now = row.next_run  # type: ignore[assignment]
    row = mem.get(sid)
    assert row.state == "paused" and row.due_at is None and row.failures_in_row == 0
    assert row.last_error is not None and row.last_error.startswith("paused: 5 occurrences in a row failed")
    [alert] = mem.alerts.values()
    assert alert["kind"] == "schedule_paused" and alert["schedule_id"] == sid and alert["send_state"] == "pending"
    clock.now += timedelta(minutes=5)
    assert drain(deps) == []  # paused: nothing more is sent, nothing more is raised
    assert len(mem.alerts) == 1


def test_a_delivery_between_failures_keeps_the_schedule_running(
        tmp_path: Path, target: Target, clock: Clock) -> None:
    deps, mem = deps_for(tmp_path, clock)
    sid = mem.add("agent-a", "p", T0, target="alerting", schedule_type="interval", schedule_value="60", anchor=T0)
    for mode in ["reject"] * 4 + ["ok"] + ["reject"] * 4:
        target.mode = mode
        drain(deps)
        clock.now = mem.get(sid).next_run  # type: ignore[assignment]
    row = mem.get(sid)
    assert row.state == "active" and row.failures_in_row == 4 and not mem.alerts


def test_the_first_prompt_held_by_the_budget_in_a_day_raises_one_alert(
        tmp_path: Path, target: Target, clock: Clock) -> None:
    deps, mem = deps_for(tmp_path, clock, max_deliveries_per_agent_per_day=1)
    for i in range(4):
        mem.add("agent-a", f"p{i}", T0 + timedelta(seconds=i), target="alerting")
    clock.now = T0 + timedelta(seconds=10)
    drain(deps)
    assert mem.outcomes().count("over_budget") == 3
    [alert] = mem.alerts.values()
    assert alert["kind"] == "over_budget" and alert["agent_id"] == "agent-a"
    mem.add("agent-a", "next day", T0 + timedelta(days=1), target="alerting")
    clock.now = T0 + timedelta(days=1, seconds=1)
    mem.add("agent-a", "next day again", T0 + timedelta(days=1), target="alerting")
    drain(deps)
    assert sorted(a["kind"] for a in mem.alerts.values()) == ["over_budget", "over_budget"]


def test_a_target_that_stops_answering_raises_one_alert_per_outage(
        tmp_path: Path, target: Target, clock: Clock) -> None:
    deps, mem = deps_for(tmp_path, clock, max_attempts=None)
    sid = mem.add("agent-a", "p", T0, target="alerting")
    mem.add("agent-b", "p", T0, target="alerting")
    target.mode = "down"
    drain(deps)
    [alert] = mem.alerts.values()
    assert alert["kind"] == "target_unready" and alert["target"] == "alerting" and alert["closed_at"] is None
    clock.now = mem.get(sid).due_at  # type: ignore[assignment]
    drain(deps)
    assert len(mem.alerts) == 1  # still the same outage
    target.mode = "ok"
    clock.now += timedelta(minutes=10)
    drain(deps)
    assert alert["closed_at"] is not None
    mem.add("agent-c", "p", clock.now, target="alerting")
    target.mode = "down"
    drain(deps)
    assert sorted(a["closed_at"] is None for a in mem.alerts.values()) == [False, True]  # a new outage


# ---- the signed POST -------------------------------------------------------------------------------


def sender_for(mem: MemoryDeliveryStore, clock: Clock, answers: list[int], got: list[httpx.Request]) -> AlertSender:
    def handle(request: httpx.Request) -> httpx.Response:
        got.append(request)
        return httpx.Response(answers.pop(0) if answers else 200)

    return AlertSender(mem, "http://alerts.example/hook", SECRET, clock, transport=httpx.MockTransport(handle))


def raise_one(mem: MemoryDeliveryStore, now: datetime) -> str:
    row = delivery_alerts.row("paused:1:x", "schedule_paused", "Schedule 1 was paused by delivery", now,
                              schedule_id=1, agent_id="agent-a", target="letta")
    mem.alerts[row["id"]] = mem._alert(row)
    return str(row["id"])


def test_an_alert_is_posted_once_signed_and_retried_with_the_same_id(clock: Clock) -> None:
    mem = MemoryDeliveryStore()
    got: list[httpx.Request] = []
    sender = sender_for(mem, clock, [503], got)
    aid = raise_one(mem, T0)

    async def run() -> list[int]:
        out = [await sender.send_due()]
        out.append(await sender.send_due())  # not due again yet: backoff
        clock.now += timedelta(seconds=delivery_alerts.backoff(1) + 1)
        out.append(await sender.send_due())
        out.append(await sender.send_due())  # sent: never again
        await sender.aclose()
        return out

    assert asyncio.run(run()) == [0, 0, 1, 0]
    assert len(got) == 2 and {r.headers["webhook-id"] for r in got} == {aid}
    for request in got:
        payload = Webhook(SECRET).verify(request.content, dict(request.headers))
        assert payload["type"] == "promptyoself.alert" and payload["data"]["kind"] == "schedule_paused"
        assert payload["data"]["alert_id"] == aid
    assert mem.alerts[aid]["send_state"] == "sent" and mem.alerts[aid]["send_attempts"] == 2


def test_an_alert_too_old_is_not_sent(clock: Clock) -> None:
    mem = MemoryDeliveryStore()
    got: list[httpx.Request] = []
    aid = raise_one(mem, T0)
    clock.now = T0 + delivery_alerts.MAX_AGE + timedelta(minutes=1)
    assert asyncio.run(sender_for(mem, clock, [], got).send_due()) == 0
    assert got == [] and mem.alerts[aid]["send_state"] == "expired"


def test_the_alert_endpoint_needs_both_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PROMPTYOSELF_ENV_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PROMPTYOSELF_ALERT_URL", "http://127.0.0.1:9/alerts")
    with pytest.raises(ConfigError, match="PROMPTYOSELF_ALERT_SECRET is not"):
        load_settings()
    monkeypatch.setenv("PROMPTYOSELF_ALERT_SECRET", "not-a-secret")
    with pytest.raises(ConfigError, match="PROMPTYOSELF_ALERT_SECRET") as err:
        load_settings()
    assert "not-a-secret" not in str(err.value)
    monkeypatch.setenv("PROMPTYOSELF_ALERT_SECRET", SECRET)
    assert load_settings().alert_endpoint == ("http://127.0.0.1:9/alerts", SECRET)


# ---- the SQL table ---------------------------------------------------------------------------------


def test_the_alerts_table_keeps_each_alert_once(tmp_path: Path) -> None:
    check_the_alerts_table(Store(f"sqlite:///{tmp_path / 'a.db'}"))


def test_the_alerts_table_on_postgres(pg_url: str) -> None:
    check_the_alerts_table(Store(pg_url))


def check_the_alerts_table(store: Store) -> None:
    try:
        row = delivery_alerts.row("k1", "over_budget", "m", T0, agent_id="agent-a")
        with store.engine.begin() as conn:
            stored_alerts.add(conn, [row, row])
        with store.engine.begin() as conn:
            stored_alerts.add(conn, [row])
        assert [a.id for a in stored_alerts.recent(store)] == [row["id"]]
        down = delivery_alerts.row("t1", "target_unready", "down", T0, target="letta")
        assert stored_alerts.open_target_alert(store, down)
        assert not stored_alerts.open_target_alert(store, delivery_alerts.row("t2", "target_unready", "d", T0,
                                                                               target="letta"))
        assert stored_alerts.close_target_alerts(store, "letta", T0) == 1
        assert stored_alerts.open_target_alert(store, delivery_alerts.row("t3", "target_unready", "d", T0,
                                                                           target="letta"))
        assert stored_alerts.by_kind(store) == {"over_budget": 1, "target_unready": 2}
        taken = stored_alerts.take_to_send(store, T0, T0 + timedelta(minutes=1), 10, T0 - timedelta(days=1))
        assert len(taken) == 3
        assert stored_alerts.take_to_send(store, T0, T0 + timedelta(minutes=1), 10, T0 - timedelta(days=1)) == []
        stored_alerts.sent(store, taken[0].id, T0)
        stored_alerts.send_failed(store, taken[1].id, "HTTP 500", T0 + timedelta(seconds=5))
        later = stored_alerts.take_to_send(store, T0 + timedelta(seconds=6), T0 + timedelta(minutes=2), 10,
                                           T0 - timedelta(days=1))
        assert [a.id for a in later] == [taken[1].id]
        assert stored_alerts.count_unseen(store) == 3
        assert stored_alerts.dismiss(store, T0) == 3 and stored_alerts.recent(store, unseen=True) == []
    finally:
        store.close()


def test_policy_and_metrics_show_the_alerts(tmp_path: Path) -> None:
    from promptyoself.core.operations import Core
    from promptyoself.delivery.metrics import registry_for, render

    core = Core(Settings(db=str(tmp_path / "m.db"), executor_autostart=False), clock=lambda: T0)
    try:
        assert asyncio.run(core.operator.policy_show())["policy"]["pause_after_failures"] == 5
        set_ = asyncio.run(core.operator.policy_set({"pause_after_failures": "3"}))
        assert set_["policy"]["pause_after_failures"] == 3
        assert asyncio.run(core.recent_policy(T0)).pause_after_failures == 3
        with core.store.engine.begin() as conn:
            stored_alerts.add(conn, [delivery_alerts.row("k", "schedule_paused", "m", T0, schedule_id=1)])
        text = render(registry_for(core)).decode()
        assert 'promptyoself_alerts_total{kind="schedule_paused"} 1.0' in text
        assert 'promptyoself_alerts_total{kind="target_unready"} 0.0' in text
        assert 'promptyoself_guardrail_limit{guardrail="pause_after_failures"} 3.0' in text
    finally:
        core.close()


def test_event_body_is_compact_json() -> None:
    mem = MemoryDeliveryStore()
    aid = raise_one(mem, T0)
    from promptyoself.store.records import AlertRow, column_names

    alert = AlertRow(**{n: mem.alerts[aid][n] for n in column_names(AlertRow)})
    body = json.loads(delivery_alerts.event_body(alert, T0))
    assert body["data"]["schedule_id"] == 1 and body["timestamp"].startswith("2026-06-15T12:00:00")


def test_the_console_banner_shows_alerts_until_dismissed(db_path: Path) -> None:
    from tests.test_console import TOKEN, make, sign_in  # the same app and sign-in as the console's tests

    core, client = make(db_path, TOKEN)
    try:
        csrf = sign_in(client)
        assert 'id="alerts"' not in client.get("/").text
        with core.store.engine.begin() as conn:
            stored_alerts.add(conn, [
                delivery_alerts.row("a", "schedule_paused", "Schedule 1 was paused by delivery: paused: 5 in a row",
                                    T0, schedule_id=1),
                delivery_alerts.row("b", "target_unready", "Target letta does not answer", T0, target="letta")])
        page = client.get("/console/policy").text
        assert 'id="alerts"' in page and "2 alerts" in page and "paused: 5 in a row" in page
        assert "(still down)" in page and 'name="pause_after_failures"' in page
        r = client.post("/console/alerts/dismiss", data={"csrf": csrf, "back": "/console/policy"})
        assert r.status_code == 303 and r.headers["location"] == "/console/policy"
        assert 'id="alerts"' not in client.get("/").text
        assert stored_alerts.count_unseen(core.store) == 0
    finally:
        client.close()
        core.close()


def five_failures_on_sql(url: str, target: Target, clock: Clock) -> None:
    from promptyoself.core.operations import Core

    core = Core(Settings(db=url, executor_autostart=False, max_attempts=1, retry_base=1.0, letta_timeout=2.0,
                         executor_interval=0.05, min_interval="1s"), clock=clock)
    target.mode = "reject"
    try:
        sid = asyncio.run(core.scheduling.schedule_every("p", "1m", agent_id="agent-a", target="alerting",
                                                         skip_validation=True))["id"]
        for _ in range(5):
            listed = asyncio.run(core.scheduling.list_schedules(agent_id="agent-a"))["schedules"]
            row = next(s for s in listed if s["id"] == sid)
            clock.now = datetime.fromisoformat(str(row["next_run"]))
            drain_once(core, budget=20)
        listed = asyncio.run(core.scheduling.list_schedules(agent_id="agent-a"))["schedules"]
        [row] = [s for s in listed if s["id"] == sid]
        assert row["state"] == "paused" and str(row["last_error"]).startswith("paused: 5 occurrences")
        [alert] = stored_alerts.recent(core.store)
        assert alert.kind == "schedule_paused" and alert.schedule_id == sid and alert.send_state == "pending"
    finally:
        core.close()


def test_five_failures_pause_on_sqlite(tmp_path: Path, target: Target, clock: Clock) -> None:
    five_failures_on_sql(f"sqlite:///{tmp_path / 'f.db'}", target, clock)


def test_five_failures_pause_on_postgres(pg_url: str, target: Target, clock: Clock) -> None:
    five_failures_on_sql(pg_url, target, clock)
