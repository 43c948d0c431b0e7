"""The operator's policy in the database and per-agent limits that hold under concurrency (issue 29
items 2, 3, 11, 12; issue 32 point 1).

* Every per-agent limit is counted in the transaction that writes (``store.schedules.create_schedule``,
  ``store.passthrough.record_send``): 200 concurrent creations against limit N make exactly N, on a
  real SQLite file and on the real PostgreSQL, from several engines (as from several processes).
* A creation whose reply cannot be made stores nothing.
* The policy is set once (``policy set``) and every face judges by it, whatever its own settings say.
* Approval judges the agent's combined rate, not each rule alone.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast
from zoneinfo import ZoneInfo

import pytest

from promptyoself.core.operations import Core
from promptyoself.core.operator import runs_per_day
from promptyoself.core.scheduling import Scheduling
from promptyoself.errors import PromptYoSelfError, QuotaExceeded, RateLimited
from tests.conftest import FIXED_NOW, make_settings

CONCURRENT = 200


def fixed(now: datetime = FIXED_NOW) -> Callable[[], datetime]:
    return lambda: now


def live_count(core: Core, agent: str) -> int:
    from promptyoself.store import schedules

    return schedules.count_live(core.store, agent)


def all_rows(core: Core) -> int:
    return int(asyncio.run(core.scheduling.list_schedules(include_cancelled=True, limit=1))["total"])


def race(cores: list[Core], n: int, make: Callable[[Core, int], object]) -> tuple[int, dict[str, int]]:
    """``n`` creations at once from threads spread over ``cores`` (each its own engine, as separate
    processes would be): how many were made, and the error codes of the others."""
    gate = threading.Barrier(n)
    made = 0
    codes: dict[str, int] = {}
    lock = threading.Lock()

    def one(i: int) -> None:
        nonlocal made
        core = cores[i % len(cores)]
        gate.wait()
        try:
            make(core, i)
        except PromptYoSelfError as exc:
            with lock:
                codes[exc.code] = codes.get(exc.code, 0) + 1
            return
        with lock:
            made += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return made, codes


def cores_on(db: str | Path, **overrides: Any) -> list[Core]:
    """Four cores on one SQLite file; two on PostgreSQL. Each core's engine may hold up to 15 server
    connections (SQLAlchemy's pool: 5 + 10 overflow), and four of them beside the other PostgreSQL tests
    of a parallel run went past the server's ``max_connections`` (100). Two pools still race each other."""
    k = 2 if str(db).startswith("postgresql") else 4
    cores = [Core(make_settings(cast(Path, db), **overrides), clock=fixed()) for _ in range(k)]
    for c in cores:
        asyncio.run(c.operator.policy())  # opened (and migrated) one after the other, before any race
    return cores


def schedule_every(core: Core, i: int) -> object:
    return asyncio.run(core.scheduling.schedule_every(f"p{i}", "1h", agent_id="agent-race", skip_validation=True))


# ---- issue 29 item 3: the limits hold under concurrency ----------------------------------------------


def hourly_limit_holds(db: str | Path) -> None:
    cores = cores_on(db, max_schedules_per_agent_per_hour=5)
    try:
        made, codes = race(cores, CONCURRENT, schedule_every)
        assert made == 5 and codes == {"rate_limited": CONCURRENT - 5}
        assert live_count(cores[0], "agent-race") == 5 and all_rows(cores[0]) == 5
    finally:
        for c in cores:
            c.close()


def max_active_holds(db: str | Path) -> None:
    cores = cores_on(db, max_schedules_per_agent_per_hour=0, max_active_per_agent=7)
    try:
        made, codes = race(cores, CONCURRENT, schedule_every)
        assert made == 7 and codes == {"quota_exceeded": CONCURRENT - 7}
        assert live_count(cores[0], "agent-race") == 7
        # another agent has its own 7
        asyncio.run(cores[1].scheduling.schedule_every("other", "1h", agent_id="agent-other", skip_validation=True))
    finally:
        for c in cores:
            c.close()


def test_hourly_limit_holds_under_200_concurrent_creations_sqlite(db_path: Path) -> None:
    hourly_limit_holds(db_path)


def test_max_active_holds_under_200_concurrent_creations_sqlite(db_path: Path) -> None:
    max_active_holds(db_path)


@pytest.mark.postgres
def test_hourly_limit_holds_under_200_concurrent_creations_postgres(pg_url: str) -> None:
    hourly_limit_holds(pg_url)


@pytest.mark.postgres
def test_max_active_holds_under_200_concurrent_creations_postgres(pg_url: str) -> None:
    max_active_holds(pg_url)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_200_concurrent_requests_through_rest_and_lettas_route(backend: str, db_path: Path,
                                                                request: pytest.FixtureRequest) -> None:
    """Real HTTP: a uvicorn server (its thread pool runs the writes) and 200 requests at once, half
    through ``/api/schedules/every``, half through Letta's ``/v1/agents/{id}/schedule``."""
    import asyncio

    import httpx

    from testkit.fake_letta import FakeLetta
    from tests.test_letta_proxy import _serve

    with FakeLetta(agents=1) as fake:
        agent = fake.agent_ids[0]
        db = db_path if backend == "sqlite" else cast(Path, request.getfixturevalue("pg_url"))
        core = Core(make_settings(db, letta_base_url=fake.url, max_schedules_per_agent_per_hour=5))
        try:
            served = _serve(core, False)
            base = next(served)

            async def burst() -> list[int]:
                async with httpx.AsyncClient(base_url=base, timeout=60) as http:
                    async def one(i: int) -> int:
                        if i % 2:
                            r = await http.post(f"/v1/agents/{agent}/schedule", json={
                                "schedule": {"type": "recurring", "cron_expression": "0 9 * * *"},
                                "messages": [{"role": "user", "content": f"m{i}"}]})
                        else:
                            r = await http.post("/api/schedules/every", json={
                                "prompt": f"p{i}", "every": "1h", "agent_id": agent, "skip_validation": True})
                        return r.status_code
                    return list(await asyncio.gather(*(one(i) for i in range(CONCURRENT))))

            codes = asyncio.run(burst())
            assert codes.count(200) == 5 and codes.count(429) == CONCURRENT - 5, sorted(set(codes))
            assert all_rows(core) == 5
            next(served, None)
        finally:
            core.close()


# ---- issue 29 item 2: creation is atomic with its validation ------------------------------------------


def test_a_creation_whose_reply_fails_stores_nothing(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    core = Core(make_settings(db_path), clock=fixed())
    try:
        def broken(*_a: object, **_k: object) -> object:
            raise OverflowError("date value out of range")

        monkeypatch.setattr(Scheduling, "_created_result", broken)
        with pytest.raises(OverflowError):
            asyncio.run(core.scheduling.schedule_every("p", "1h", agent_id="agent-a", skip_validation=True))
        monkeypatch.undo()
        assert all_rows(core) == 0
    finally:
        core.close()


def test_the_year_9999_interval_stores_no_row(db_path: Path) -> None:
    from fastapi.testclient import TestClient

    from promptyoself.faces.rest import build_rest_app

    core = Core(make_settings(db_path), clock=fixed())
    try:
        with TestClient(build_rest_app(core), raise_server_exceptions=False) as http:
            r = http.post("/api/schedules/every", json={"prompt": "p", "every": "10s", "agent_id": "agent-a",
                                                        "start_at": "9999-12-31T23:59:55Z", "skip_validation": True})
            assert r.status_code >= 400
            listed = http.get("/api/schedules", params={"include_cancelled": "true"})
            assert listed.status_code == 200 and listed.json()["total"] == 0
    finally:
        core.close()


# ---- issue 32 point 1: the policy lives in the database --------------------------------------------


def test_policy_show_says_where_each_value_came_from(db_path: Path) -> None:
    first = Core(make_settings(db_path, approval_below="10m"), clock=fixed())
    try:
        shown = {e["name"]: e for e in asyncio.run(first.operator.policy_show())["policy_entries"]}
        assert shown["approval_below"]["value"] == "10m" and shown["approval_below"]["source"] == "environment seed"
        assert "PROMPTYOSELF_APPROVAL_BELOW" in shown["approval_below"]["origin"]
        assert shown["max_active_per_agent"]["source"] == "default"
        result = asyncio.run(first.operator.policy_set({"max-active-per-agent": "3",
                                                        "max_schedules_per_agent_per_hour": 4}))
        assert result["policy"]["max_active_per_agent"] == 3
        assert result["policy"]["max_schedules_per_agent_per_hour"] == 4
        with pytest.raises(PromptYoSelfError) as bad:
            asyncio.run(first.operator.policy_set({"approval_below": "soon"}))
        assert bad.value.code == "invalid_argument"
        with pytest.raises(PromptYoSelfError):
            asyncio.run(first.operator.policy_set({"nonsense": "1"}))
        with pytest.raises(PromptYoSelfError):
            asyncio.run(first.operator.policy_set({"max_active_per_agent": "0"}))
    finally:
        first.close()
    # a later process with another environment: the stored values stand, and show says so
    later = Core(make_settings(db_path, approval_below="1h", max_active_per_agent=50), clock=fixed())
    try:
        shown = {e["name"]: e for e in asyncio.run(later.operator.policy_show())["policy_entries"]}
        assert shown["approval_below"]["value"] == "10m", "the environment only seeds"
        assert shown["max_active_per_agent"]["value"] == 3 and shown["max_active_per_agent"]["source"] == "database"
        note = shown["max_active_per_agent"]["note"]
        assert "PROMPTYOSELF_MAX_ACTIVE_PER_AGENT=50 in this environment is ignored" in note
        # a value nobody set is seeded once by the first environment that sets it
        assert shown["max_deliveries_per_agent_per_day"]["source"] == "default"
    finally:
        later.close()
    third = Core(make_settings(db_path, max_deliveries_per_agent_per_day=7), clock=fixed())
    try:
        assert asyncio.run(third.operator.policy()).max_deliveries_per_agent_per_day == 7
        assert asyncio.run(third.operator.policy_show())["policy_entries"][0]["source"] == "environment seed"
    finally:
        third.close()
    fourth = Core(make_settings(db_path, max_deliveries_per_agent_per_day=9), clock=fixed())
    try:
        assert asyncio.run(fourth.operator.policy()).max_deliveries_per_agent_per_day == 7
    finally:
        fourth.close()


@pytest.fixture
def policy_db(db_path: Path) -> Path:
    """A database whose policy an operator set once: approval below 10m, at most 3 live schedules."""
    setter = Core(make_settings(db_path), clock=fixed())
    asyncio.run(setter.operator.policy_set({"approval_below": "10m", "max_active_per_agent": "3"}))
    setter.close()
    return db_path


def face_core(db: Path, **extra: Any) -> Core:
    """A writer whose own settings say otherwise (approval off, 100 live schedules)."""
    return Core(make_settings(db, approval_below="off", max_active_per_agent=100, **extra), clock=fixed())


def test_every_face_judges_by_the_stored_policy(policy_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    from fastapi.testclient import TestClient
    from fastmcp import Client

    from promptyoself.faces import cli
    from promptyoself.faces.mcp import build_server
    from promptyoself.faces.rest import build_rest_app

    states: dict[str, str] = {}

    mcp_core = face_core(policy_db)
    try:
        async def via_mcp() -> str:
            async with Client(build_server(mcp_core)) as client:
                got = await client.call_tool("promptyoself_schedule_every",
                                             {"prompt": "p", "every": "2m", "agent_id": "agent-mcp",
                                              "skip_validation": True})
                return str(json.loads(got.content[0].text)["state"])
        states["mcp"] = asyncio.run(via_mcp())
    finally:
        mcp_core.close()

    cli_core = face_core(policy_db)
    try:
        code = cli.main(["schedule", "--prompt", "p", "--every", "2m", "--agent-id", "agent-cli",
                         "--skip-validation", "--json"], core=cli_core)
        assert code == 0
        states["cli"] = json.loads(capsys.readouterr().out)["state"]
        assert cli.main(["policy", "show", "--json"], core=cli_core) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["policy"]["approval_below"] == "10m"
    finally:
        cli_core.close()

    rest_core = face_core(policy_db)
    try:
        with TestClient(build_rest_app(rest_core)) as http:
            r = http.post("/api/schedules/every", json={"prompt": "p", "every": "2m", "agent_id": "agent-rest",
                                                        "skip_validation": True})
            states["rest"] = r.json()["state"]
            # max_active_per_agent=3 from the database, not the writer's 100
            for i in range(2):
                assert http.post("/api/schedules/every", json={"prompt": f"q{i}", "every": "1h",
                                                               "agent_id": "agent-rest",
                                                               "skip_validation": True}).status_code == 200
            full = http.post("/api/schedules/every", json={"prompt": "q", "every": "1h", "agent_id": "agent-rest",
                                                           "skip_validation": True})
            assert full.status_code == 409 and full.json()["code"] == "quota_exceeded"
            assert "limit is 3" in full.json()["error"]
    finally:
        rest_core.close()

    assert states == {"mcp": "pending_approval", "cli": "pending_approval", "rest": "pending_approval"}


@pytest.mark.slow
def test_lettas_scheduling_route_judges_by_the_stored_policy(policy_db: Path) -> None:
    from fastapi.testclient import TestClient

    from promptyoself.faces.rest import build_rest_app
    from testkit.fake_letta import FakeLetta

    with FakeLetta(agents=1) as fake:
        agent = fake.agent_ids[0]
        core = face_core(policy_db, letta_base_url=fake.url)
        try:
            with TestClient(build_rest_app(core)) as http:
                r = http.post(f"/v1/agents/{agent}/schedule", json={
                    "schedule": {"type": "recurring", "cron_expression": "*/2 * * * *"},
                    "messages": [{"role": "user", "content": "m"}]})
                assert r.status_code == 200
            row = asyncio.run(core.scheduling.list_schedules(agent_id=agent))["schedules"][0]
            assert row["state"] == "pending_approval"
        finally:
            core.close()


def test_rest_policy_routes(db_path: Path) -> None:
    from fastapi.testclient import TestClient

    from promptyoself.faces.rest import build_rest_app

    core = Core(make_settings(db_path, http_token="operator-token-123456"), clock=fixed())
    try:
        with TestClient(build_rest_app(core)) as http:
            assert http.get("/api/policy").status_code == 401
            auth = {"Authorization": "Bearer operator-token-123456"}
            got = http.get("/api/policy", headers=auth).json()
            assert got["policy"]["max_active_per_agent"] == 100
            put = http.put("/api/policy", headers=auth, json={"approval_below": "30m", "max_active_per_agent": 9})
            assert put.status_code == 200 and put.json()["policy"] == {
                "max_deliveries_per_agent_per_day": 500, "max_schedules_per_agent_per_hour": 60,
                "approval_below": "30m", "max_active_per_agent": 9, "pause_after_failures": 5,
                "max_tokens_per_agent_per_day": 0, "max_cost_usd_per_agent_per_day": 0.0}
            assert http.put("/api/policy", headers=auth, json={"max_active_per_agent": True}).status_code == 422
            assert http.put("/api/policy", headers=auth, json={"max_active_per_agent": -1}).status_code == 400
            assert http.put("/api/policy", headers=auth, json={"budget": 1}).status_code == 422
            from promptyoself.core import agent_tokens

            agent = {"Authorization": "Bearer " + asyncio.run(agent_tokens.mint(core, "agent-own"))["token"]}
            for refused in (http.get("/api/policy", headers=agent),
                            http.put("/api/policy", headers=agent, json={"max_active_per_agent": 1000})):
                assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
        assert asyncio.run(core.operator.policy()).max_active_per_agent == 9
    finally:
        core.close()


def test_console_policy_page_needs_its_csrf_token(db_path: Path) -> None:
    import re

    from fastapi.testclient import TestClient

    from promptyoself.faces.console import build_console

    core = Core(make_settings(db_path), clock=fixed())
    try:
        with TestClient(build_console(core), base_url="http://127.0.0.1") as http:
            page = http.get("/console/policy")
            assert page.status_code == 200 and "max_schedules_per_agent_per_hour" in page.text
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert csrf is not None
            refused = http.post("/console/policy", data={"approval_below": "5m"})
            assert refused.status_code == 403
            assert asyncio.run(core.operator.policy()).approval_below is None
            saved = http.post("/console/policy", data={"csrf": csrf.group(1), "approval_below": "5m",
                                                       "max_active_per_agent": "100"}, follow_redirects=False)
            assert saved.status_code == 303
            assert asyncio.run(core.operator.policy()).approval_below == timedelta(minutes=5)
            bad = http.post("/console/policy", data={"csrf": csrf.group(1), "max_active_per_agent": "lots"})
            assert bad.status_code == 400 and "max_active_per_agent takes" in bad.text
    finally:
        core.close()


async def test_delivery_budget_reads_the_stored_policy(db_path: Path) -> None:
    from promptyoself.delivery import budget
    from tests.helpers_delivery import add_schedule

    core = Core(make_settings(db_path, max_deliveries_per_agent_per_day=500), clock=fixed())
    try:
        await core.operator.policy_set({"max_deliveries_per_agent_per_day": 0})
        sid = add_schedule(core.store, "agent-b", "p", FIXED_NOW)
        from promptyoself.store.schedules import get

        row = get(core.store, sid)
        assert row is not None
        assert (await budget.verdict(core, row, FIXED_NOW)).over is None
        await core.operator.policy_set({"max_deliveries_per_agent_per_day": 1})
        from promptyoself.store.passthrough import record_send

        record_send(core.store, "agent-b", "/v1/agents/agent-b/messages", FIXED_NOW, budget=1,
                    since=FIXED_NOW - timedelta(hours=1))
        verdict = await budget.verdict(core, row, FIXED_NOW)
        assert verdict.over is not None and "max_deliveries_per_agent_per_day=1" in verdict.over
    finally:
        core.close()


def test_metrics_show_the_stored_policy_not_this_processs_environment(db_path: Path) -> None:
    """/metrics' guardrail gauges read the operator's policy, as every writer and the delivery do: a
    scraping process started with other values in its environment shows the stored ones."""
    from promptyoself.delivery.metrics import registry_for, render

    writer = Core(make_settings(db_path), clock=fixed())
    try:
        asyncio.run(writer.operator.policy_set({"max_deliveries_per_agent_per_day": 7, "approval_below": "10m",
                           "max_active_per_agent": 3}))
    finally:
        writer.close()
    scraper = Core(make_settings(db_path, max_deliveries_per_agent_per_day=500, approval_below="1h"), clock=fixed())
    try:
        text = render(registry_for(scraper)).decode()
    finally:
        scraper.close()
    assert 'promptyoself_guardrail_limit{guardrail="max_deliveries_per_agent_per_day"} 7.0' in text
    assert 'promptyoself_guardrail_limit{guardrail="approval_below_seconds"} 600.0' in text
    assert 'promptyoself_guardrail_limit{guardrail="max_active_per_agent"} 3.0' in text


# ---- issue 29 item 11: approval by the agent's combined rate ---------------------------------------


def test_runs_per_day_of_each_kind_of_rule() -> None:
    utc = ZoneInfo("UTC")
    start = datetime(2026, 6, 15, 0, 0, tzinfo=UTC)
    assert runs_per_day("once", start.isoformat(), utc, start) == 0
    assert runs_per_day("interval", "30m", utc, start) == 48
    assert runs_per_day("cron", "12 * * * *", utc, start + timedelta(minutes=12)) == 24
    assert runs_per_day("cron", "0 9 * * *", utc, start + timedelta(hours=9)) == 1
    assert runs_per_day("cron", "*/5 * * * *", utc, start) == pytest.approx(288)  # extrapolated from 48 runs


def test_approval_cannot_be_split_across_rules(db_path: Path) -> None:
    core = Core(make_settings(db_path, approval_below="30m"), clock=fixed())
    try:
        states = [asyncio.run(core.scheduling.schedule_cron(f"tick {m}", f"{m} * * * *", agent_id="agent-split",
                                                            skip_validation=True))
                  for m in (0, 12, 24, 36, 48)]
        # 24 a day each; together more than one run per 30 minutes (48 a day) from the third on
        assert [s["state"] for s in states] == ["active", "active", "pending_approval", "pending_approval",
                                                "pending_approval"]
        assert "at most 48 a day" in states[2]["message"]
        # rules far apart in the day are not frequent together; another agent has its own rate
        daily = [asyncio.run(core.scheduling.schedule_cron("d", f"{m} 9 * * *", agent_id="agent-daily",
                                                           skip_validation=True))["state"]
                 for m in (0, 5)]
        assert daily == ["active", "active"]
        # one-time prompts never wait, and a cancelled rule no longer counts
        assert asyncio.run(core.scheduling.schedule_time("once", "in 5m", agent_id="agent-split",
                                                         skip_validation=True))["state"] == "active"
        asyncio.run(core.scheduling.cancel(states[1]["id"]))
        again = asyncio.run(core.scheduling.schedule_cron("again", "30 * * * *", agent_id="agent-split",
                                                          skip_validation=True))
        assert again["state"] == "active"
    finally:
        core.close()


def combined_rate_holds(db: str | Path) -> None:
    """50 hourly rules at once, each at its own minute, with approval below 30m (48 runs a day
    together): exactly two start active, whatever the interleaving."""
    cores = cores_on(db, approval_below="30m")
    try:
        def make(core: Core, i: int) -> object:
            return asyncio.run(core.scheduling.schedule_cron(f"tick {i}", f"{i} * * * *", agent_id="agent-rate",
                                                             skip_validation=True))

        made, codes = race(cores, 50, make)
        assert made == 50 and codes == {}
        states = [s["state"] for s in asyncio.run(cores[0].scheduling.list_schedules(agent_id="agent-rate",
                                                                                     limit=100))["schedules"]]
        assert sorted(states).count("active") == 2 and states.count("pending_approval") == 48
    finally:
        for c in cores:
            c.close()


def test_combined_rate_holds_under_concurrent_creations_sqlite(db_path: Path) -> None:
    combined_rate_holds(db_path)


@pytest.mark.postgres
def test_combined_rate_holds_under_concurrent_creations_postgres(pg_url: str) -> None:
    combined_rate_holds(pg_url)


# ---- issue 29 item 12: pass-through sends count against the budget ----------------------------------


def test_pass_through_sends_are_counted_atomically(db_path: Path) -> None:
    from promptyoself.store.passthrough import BudgetReached, record_send

    cores = cores_on(db_path)
    ok = 0
    refused = 0
    lock = threading.Lock()
    gate = threading.Barrier(40)

    def one(i: int) -> None:
        nonlocal ok, refused
        gate.wait()
        try:
            record_send(cores[i % 4].store, "agent-p", "/v1/agents/agent-p/messages", FIXED_NOW, budget=3,
                        since=FIXED_NOW - timedelta(hours=12))
        except BudgetReached:
            with lock:
                refused += 1
            return
        with lock:
            ok += 1

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert (ok, refused) == (3, 37)
    finally:
        for c in cores:
            c.close()


@pytest.mark.slow
def test_pass_through_sends_count_against_the_daily_budget(db_path: Path) -> None:
    from fastapi.testclient import TestClient

    from promptyoself.faces.delivery import run_once_result
    from promptyoself.faces.rest import build_rest_app
    from testkit.fake_letta import FakeLetta
    from tests.helpers_delivery import add_schedule

    with FakeLetta(agents=1) as fake:
        agent = fake.agent_ids[0]
        core = Core(make_settings(db_path, letta_base_url=fake.url, max_deliveries_per_agent_per_day=1))
        try:
            with TestClient(build_rest_app(core, letta_proxy=True)) as http:
                codes = [http.post(f"/v1/agents/{agent}/messages/async",
                                   json={"messages": [{"role": "user", "content": f"hi {i}"}]}).status_code
                         for i in range(3)]
                assert codes == [200, 429, 429]
                refused = http.post(f"/v1/agents/{agent}/messages",
                                    json={"messages": [{"role": "user", "content": "again"}]})
                assert refused.json()["code"] == "rate_limited" and "Retry-After" in refused.headers
                assert http.get(f"/v1/agents/{agent}").status_code == 200, "reads are not sends"
                conv = http.post("/v1/conversations/c-1/messages", json={"messages": []})
                assert conv.status_code == 400 and "cannot count" in conv.json()["error"]
            assert len(fake.received_texts()) == 1
            # and the scheduled prompts see the day used up
            add_schedule(core.store, agent, "scheduled", datetime.now(UTC) - timedelta(seconds=1))
            executed = run_once_result(core).get("executed") or []
            assert [e.get("outcome") for e in executed] == ["over_budget"]
            assert len(fake.received_texts()) == 1
            assert asyncio.run(core.operator.agent_usage(agent))["delivered_today"] == 1
        finally:
            core.close()


def test_quota_error_names_the_stored_limit(db_path: Path) -> None:
    core = Core(make_settings(db_path), clock=fixed())
    try:
        asyncio.run(core.operator.policy_set({"max_active_per_agent": 1, "max_schedules_per_agent_per_hour": 0}))
        asyncio.run(core.scheduling.schedule_every("a", "1h", agent_id="agent-q", skip_validation=True))
        with pytest.raises(QuotaExceeded, match="limit is 1"):
            asyncio.run(core.scheduling.schedule_every("b", "1h", agent_id="agent-q", skip_validation=True))
        asyncio.run(core.operator.policy_set({"max_active_per_agent": 5, "max_schedules_per_agent_per_hour": 1}))
        with pytest.raises(RateLimited):
            asyncio.run(core.scheduling.schedule_every("c", "1h", agent_id="agent-q", skip_validation=True))
    finally:
        core.close()

