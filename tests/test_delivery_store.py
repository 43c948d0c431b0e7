"""The ``DeliveryStore`` contract (issue 30 point 3), one suite against all three implementations:
SQLite (a real file), PostgreSQL (a throw-away schema; ``PROMPTYOSELF_TEST_PG_URL``) and memory.
Claims are compare-and-sets, one live claim per agent; a lapsed claim is free and its taker told;
``renew`` answers what is still held; ``record`` writes only under a held claim on an unchanged row
(else lost or stale) and may claim more in the same transaction. Every time is a fixed argument."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from promptyoself.store import claims
from promptyoself.store.claims import ClaimAsk, ClaimReport, Outcome
from promptyoself.store.db import Schedule, Store
from promptyoself.store.delivery_store import DeliveryStore, SqlDeliveryStore
from promptyoself.store.health import Backlog
from promptyoself.store.memory import MemoryDeliveryStore
from promptyoself.store.records import DayAsk, DayCount
from tests.helpers_delivery import add_schedule, get, history

T0 = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)


DAY = T0 - timedelta(hours=6)
"""The budget day's start (the stores count claims' days from it)."""


class Budget:
    """The stores' ``day``: the budget day and the agent's cap a test sets (0 by default: none)."""

    def __init__(self) -> None:
        self.cap = 0
        self.threads: list[str] = []
        """The threads it was asked on (the event loop's: it is async, asked before the claim's transaction)."""

    async def __call__(self, now: datetime) -> DayAsk:
        self.threads.append(threading.current_thread().name)
        return DayAsk(DAY, self.cap)


class Env:
    """One implementation, with the seeding and reading a test needs besides the contract's verbs."""

    def __init__(self, ds: DeliveryStore, budget: Budget, store: Store | None = None) -> None:
        self.ds = ds
        self.budget = budget
        self.store = store

    def add(self, agent: str, due: datetime, **columns: Any) -> int:
        if self.store is None:
            assert isinstance(self.ds, MemoryDeliveryStore)
            if "value" in columns:  # add_schedule's name for the rule's value
                columns["schedule_value"] = columns.pop("value")
            return self.ds.add(agent, f"p-{agent}", due, **columns)
        sid = add_schedule(self.store, agent, f"p-{agent}", due,
                           schedule_type=columns.pop("schedule_type", "once"), value=columns.pop("value", None))
        if columns:
            with self.store.session() as s:
                s.execute(update(Schedule).where(Schedule.id == sid).values(**columns))
        return sid

    def row(self, sid: int) -> Any:
        if self.store is None:
            assert isinstance(self.ds, MemoryDeliveryStore)
            return self.ds.get(sid)
        return get(self.store, sid)

    def outcomes(self) -> list[tuple[int, str]]:
        if self.store is None:
            assert isinstance(self.ds, MemoryDeliveryStore)
            return [(h["schedule_id"], h["outcome"]) for h in self.ds.history]
        return [(h.schedule_id, h.outcome) for h in history(self.store)]


@contextmanager
def opened(kind: str, tmp_path: Path) -> Iterator[Env]:
    budget = Budget()
    if kind == "memory":
        yield Env(MemoryDeliveryStore(day=budget), budget)
        return
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'contract.db'}"
        store = Store(url)
        yield Env(SqlDeliveryStore(store, day=budget), budget, store)
        store.close()
        return
    from tests.pg import pg_schema, require_pg

    require_pg()
    with pg_schema() as url:
        store = Store(url)
        yield Env(SqlDeliveryStore(store, day=budget), budget, store)
        store.close()


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    with opened(request.param, tmp_path) as found:
        yield found


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    """The database stores only (what memory does not hold: pass-through sends)."""
    with opened(request.param, tmp_path) as found:
        yield found


def outcome(env: Env, sid: int, owner: str, kind: str = "delivered", *, basis: tuple[tuple[str, Any], ...] = (),
            at: datetime = T0, **change: Any) -> Outcome:
    row = env.row(sid)
    slot = row.next_run
    entry = {"schedule_id": sid, "agent_id": row.agent_id, "scheduled_for": slot, "attempted_at": at,
             "outcome": kind, "attempt": 1, "letta_run_id": None, "error": None, "lateness_s": 0.0}
    done = {"claimed_by": None, "claim_until": None, "updated_at": at, **(change or {"state": "completed",
                                                                                    "due_at": None})}
    return Outcome(sid, owner, slot, basis, (entry,), done, ({**entry, "outcome": "sent_lost_claim"},))


async def test_a_claim_is_one_compare_and_set_and_one_live_claim_per_agent(env: Env) -> None:
    a1 = env.add("agent-a", T0 - timedelta(seconds=2))
    env.add("agent-a", T0 - timedelta(seconds=1))
    b = env.add("agent-b", T0)
    env.add("agent-c", T0 + timedelta(hours=1))  # not due
    env.add("agent-d", T0 - timedelta(seconds=5), state="paused")
    taken = await env.ds.claim("A", T0, T0 + LEASE, limit=10)
    assert [r.id for r in taken] == [a1, b]  # oldest due first, the agent's earliest only
    assert all(r.claimed_by == "A" and r.claim_until == T0 + LEASE for r in taken)
    assert await env.ds.claim("B", T0, T0 + LEASE, limit=10) == []  # held, and agent-a is busy
    assert await env.ds.next_due(T0) == T0 - timedelta(seconds=1)
    assert await env.ds.next_due(T0, exclude_agents=["agent-a"]) == T0 + timedelta(hours=1)


async def test_a_claim_takes_at_most_each_targets_room_and_skips_full_targets(env: Env) -> None:
    """Issue 42: the executor's send slots are per target. A claim takes at most each target's room
    (``TargetRoom``); a target with none is left out of the query, so its older due rows neither fill
    the claim nor its candidates; ``next_due`` leaves it out too."""
    from promptyoself.store.claims import ClaimAsk, TargetRoom

    hung = [env.add(f"session-{i}", T0 - timedelta(seconds=60 - i), target="claude-code") for i in range(6)]
    letta = [env.add(f"agent-{i}", T0 - timedelta(seconds=10 - i)) for i in range(3)]
    hooks = [env.add(f"hook-{i}", T0 - timedelta(seconds=5 - i), target="webhook") for i in range(3)]
    room = TargetRoom((("claude-code", 0), ("letta", 2)), other=1)
    taken = await env.ds.claim("A", T0, T0 + LEASE, limit=10, targets=room)
    assert [r.id for r in taken] == letta[:2] + hooks[:1]  # none of the full target's, older as they are
    assert await env.ds.next_due(T0, exclude_targets=["claude-code"]) == T0 - timedelta(seconds=8)
    assert await env.ds.next_due(T0) == T0 - timedelta(seconds=60)
    recorded = await env.ds.record([], claim=ClaimAsk("A", T0, T0 + LEASE, 10, targets=TargetRoom((("claude-code", 2),),
                                                                                           other=0)))
    assert [r.id for r in recorded.claimed] == hung[:2]


async def test_pending_receipts_are_listed_oldest_first_and_completed_once(env: Env) -> None:
    """Issue 43: the rows recorded with a ``pending`` receipt (in one batch: PostgreSQL's unnest path)
    are listed with their schedule's target and run, and completed only while still pending."""
    a, b, c = env.add("agent-a", T0), env.add("agent-b", T0), env.add("agent-c", T0)
    await env.ds.claim("A", T0, T0 + LEASE, limit=5)
    batch = []
    for sid, state in ((a, "pending"), (b, "complete"), (c, "pending")):
        o = outcome(env, sid, "A")
        entry = {**o.history[0], "letta_run_id": f"run-{sid}", "receipt_state": state,
                 "receipt": f'{{"state":"{state}"}}'}
        batch.append(Outcome(o.schedule_id, o.owner, o.slot, o.basis, (entry,), o.change, o.lost_history))
    assert (await env.ds.record(batch)).written == {a, b, c}
    pending = await env.ds.pending_receipts(10)
    assert [(p.schedule_id, p.agent_id, p.target, p.letta_run_id, p.attempted_at, p.receipt) for p in pending] == [
        (a, "agent-a", "letta", f"run-{a}", T0, '{"state":"pending"}'),
        (c, "agent-c", "letta", f"run-{c}", T0, '{"state":"pending"}')]
    assert [p.schedule_id for p in await env.ds.pending_receipts(1)] == [a]
    assert [p.schedule_id for p in await env.ds.pending_receipts(10, after_id=pending[0].delivery_id)] == [c]
    assert await env.ds.complete_receipt(pending[0].delivery_id, "complete", '{"state":"complete","reply":"ok"}')
    assert not await env.ds.complete_receipt(pending[0].delivery_id, "timed_out", '{"state":"timed_out"}')  # once
    assert [p.schedule_id for p in await env.ds.pending_receipts(10)] == [c]


async def test_the_sql_stores_work_runs_in_its_own_threads_and_the_memory_stores_on_the_loop(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interface is async: a verb is awaited on the event loop. The SQL store's blocking work (the
    claim's transaction) runs in the store's own pool, never on the loop's thread; the memory store's
    runs on the loop (no thread: it is memory). The budget day is asked on the loop before the claim
    (``Deps.budget_day`` reads the policy through the store's ``policy`` verb, in the pool)."""
    sid = env.add("agent-a", T0 - timedelta(seconds=1))
    seen: list[str] = []
    if isinstance(env.ds, SqlDeliveryStore):
        real = claims.claim_due

        def claim_due(*args: Any, **kwargs: Any) -> Any:
            seen.append(threading.current_thread().name)
            return real(*args, **kwargs)

        monkeypatch.setattr(claims, "claim_due", claim_due)
    [row] = await env.ds.claim("A", T0, T0 + LEASE, limit=5)
    assert row.id == sid and (await env.ds.record([outcome(env, sid, "A")])).written == {sid}
    loop_thread = threading.current_thread().name
    assert env.budget.threads and set(env.budget.threads) == {loop_thread}
    if env.store is not None:
        assert seen and all(t.startswith("promptyoself-store") for t in seen)


async def test_a_lapsed_claim_is_taken_over_and_its_first_holder_loses_it(env: Env) -> None:
    sid = env.add("agent-a", T0)
    assert [r.id for r in await env.ds.claim("A", T0, T0 + LEASE, limit=5)] == [sid]
    assert await env.ds.renew("A", [sid], T0 + 2 * LEASE) == {sid}
    later = T0 + 3 * LEASE  # A froze: its claim ran out
    taken: set[int] = set()
    [again] = await env.ds.claim("B", later, later + LEASE, limit=5, taken_over=taken)
    assert again.id == sid and taken == {sid}
    assert await env.ds.renew("A", [sid], later + LEASE) == set()  # A's fence now says no
    recorded = await env.ds.record([outcome(env, sid, "A", at=later)])
    assert recorded.lost == {sid} and not recorded.written
    assert (await env.ds.record([outcome(env, sid, "B", at=later)])).written == {sid}
    assert env.outcomes() == [(sid, "sent_lost_claim"), (sid, "delivered")]
    assert env.row(sid).state == "completed" and env.row(sid).claimed_by is None


async def test_a_released_claim_is_free_and_not_in_doubt(env: Env) -> None:
    sid = env.add("agent-a", T0)
    await env.ds.claim("A", T0, T0 + LEASE, limit=1)
    assert await env.ds.release("B", [sid]) == 0  # only the holder gives it back
    assert await env.ds.release("A", [sid]) == 1
    taken: set[int] = set()
    assert [r.id for r in await env.ds.claim("B", T0, T0 + LEASE, limit=1, taken_over=taken)] == [sid]
    assert taken == set()


async def test_a_row_changed_under_its_claim_is_stale_and_nothing_is_written(env: Env) -> None:
    sid = env.add("agent-a", T0)
    await env.ds.claim("A", T0, T0 + LEASE, limit=1)
    recorded = await env.ds.record([outcome(env, sid, "A", basis=(("state", "paused"),))])
    assert sid in recorded.fresh and recorded.fresh[sid].state == "active"
    assert not recorded.written and not recorded.lost and env.outcomes() == []


async def test_recording_frees_the_agent_and_claims_its_next_in_the_same_transaction(env: Env) -> None:
    first = env.add("agent-a", T0 - timedelta(seconds=1))
    second = env.add("agent-a", T0)
    await env.ds.claim("A", T0, T0 + LEASE, limit=5)
    recorded = await env.ds.record([outcome(env, first, "A")], claim=ClaimAsk("A", T0, T0 + LEASE, 5))
    assert recorded.written == {first}
    assert [r.id for r in recorded.claimed] == [second] and not recorded.more_due


async def test_a_claim_reports_when_more_was_due_than_it_asked_for(env: Env) -> None:
    for i in range(6):
        env.add(f"agent-{i}", T0)
    report = ClaimReport()
    assert len(await env.ds.claim("A", T0, T0 + LEASE, limit=2, report=report)) == 2 and report.more_due
    report = ClaimReport()
    assert len(await env.ds.claim("A", T0, T0 + LEASE, limit=10, report=report)) == 4 and not report.more_due


async def test_an_outage_ends_and_the_waiting_are_due_now(env: Env) -> None:
    later = T0 + timedelta(minutes=5)
    waiting = env.add("agent-a", later, attempt=1, last_error="letta_unavailable: down")
    env.add("agent-b", later, attempt=1, last_error="letta_unavailable: HTTP 429")  # its Retry-After stands
    env.add("agent-c", later)  # never tried
    assert await env.ds.resume_waiting(T0) == 1
    assert env.row(waiting).due_at == T0


async def test_history_counts_for_the_budget_and_the_attempts(env: Env) -> None:
    sid = env.add("agent-a", T0)
    slot = env.row(sid).next_run
    await env.ds.claim("A", T0, T0 + LEASE, limit=1)
    over = outcome(env, sid, "A", "over_budget", state="active", next_run=slot + timedelta(hours=1),
                   due_at=slot + timedelta(hours=1))
    entry = {**over.history[0], "error": "letta_auth: refused"}
    await env.ds.record([Outcome(sid, "A", slot, (), (entry,), over.change, ())])
    assert await env.ds.count_attempts_with_error(sid, slot, "letta_auth:") == 1
    assert await env.ds.count_attempts_with_error(sid, slot, "other:") == 0
    seen = await env.ds.recent(T0 - timedelta(hours=1), 5, agent_id="agent-a")
    assert (seen.delivered_today, seen.over_budget_unannounced) == (0, 1)
    await env.ds.claim("A", T0 + timedelta(hours=2), T0 + timedelta(hours=2) + LEASE, limit=1)
    await env.ds.record([outcome(env, sid, "A", at=T0 + timedelta(hours=2))])
    seen = await env.ds.recent(T0 - timedelta(hours=1), 5, schedule_id=sid)
    assert (seen.delivered_today, seen.over_budget_unannounced) == (1, 0)


async def deliver_at(env: Env, sid: int, at: datetime, kind: str = "delivered", *, then: datetime | None = None,
                     claim: ClaimAsk | None = None) -> Any:
    """Claim ``sid`` at ``at`` and record ``kind`` then; an interval row moves on to ``then``."""
    assert [r.id for r in await env.ds.claim("A", at, at + LEASE, limit=1)] == [sid]
    change = {"state": "active", "next_run": then, "due_at": then} if then else {}
    return await env.ds.record([outcome(env, sid, "A", kind, at=at, **change)], claim=claim)


async def test_a_claim_counts_each_rows_budget_day_in_its_own_transaction(env: Env) -> None:
    every = env.add("agent-a", T0 - timedelta(hours=7), schedule_type="interval", value="1h", max_per_day=2)
    await deliver_at(env, every, T0 - timedelta(hours=7), then=T0 - timedelta(hours=2))  # the day before: not counted
    await deliver_at(env, every, T0 - timedelta(hours=2), then=T0 - timedelta(hours=1))
    await deliver_at(env, every, T0 - timedelta(hours=1), "over_budget", then=T0)
    other = env.add("agent-b", T0 - timedelta(minutes=1))
    env.budget.cap = 5
    days = {r.id: r.day for r in await env.ds.claim("A", T0, T0 + LEASE, limit=5)}
    # cap, the agent's delivered today, the schedule's, over_budget since the agent's last delivery
    assert days == {every: DayCount(5, 1, 1, 1), other: DayCount(5, 0, 0, 0)}


async def test_a_claims_unannounced_count_is_its_own_agents_whatever_other_agents_did(env: Env) -> None:
    """The count of held-back prompts looks at the claimed row's agent alone: another agent's later
    delivery does not announce this agent's (the SQL once took "the last delivery" of any agent with a
    schedule: a cross join with the whole schedules table, slower with every row)."""
    held = env.add("agent-a", T0 - timedelta(hours=2), schedule_type="interval", value="1h")
    await deliver_at(env, held, T0 - timedelta(hours=2), "over_budget", then=T0)
    other = env.add("agent-b", T0 - timedelta(hours=1))
    await deliver_at(env, other, T0 - timedelta(minutes=30))
    env.budget.cap = 5
    days = {r.id: r.day for r in await env.ds.claim("A", T0, T0 + LEASE, limit=5)}
    assert days == {held: DayCount(5, 0, 0, 1)}


async def test_the_claim_in_the_recording_transaction_counts_what_it_just_recorded(env: Env) -> None:
    first = env.add("agent-a", T0 - timedelta(minutes=1))
    second = env.add("agent-a", T0)
    env.budget.cap = 3
    recorded = await deliver_at(env, first, T0, claim=ClaimAsk("A", T0, T0 + LEASE, 5))
    assert [(r.id, r.day) for r in recorded.claimed] == [(second, DayCount(3, 1, 0, 0))]


async def test_deliveries_dated_after_now_do_not_count_against_todays_budget(env: Env) -> None:
    """Issue 42 finding 12: the clock jumped a day ahead, prompts were delivered (dated tomorrow), and it
    came back. Those rows are not today's: the agent is not over its budget for the rest of the day."""
    every = env.add("agent-a", T0 - timedelta(hours=1), schedule_type="interval", value="1h", max_per_day=2)
    await deliver_at(env, every, T0 - timedelta(hours=1), then=T0 + timedelta(days=1))  # today, before the jump
    tomorrow = T0 + timedelta(days=1)
    await deliver_at(env, every, tomorrow, then=tomorrow + timedelta(hours=1))  # while the clock ran a day ahead
    await deliver_at(env, every, tomorrow + timedelta(hours=1), then=T0 + timedelta(minutes=1))
    env.budget.cap = 2
    clock_back = T0 + timedelta(minutes=1)  # the clock is right again: today, noon
    [row] = await env.ds.claim("A", clock_back, clock_back + LEASE, limit=1)
    assert row.id == every and row.day == DayCount(2, 1, 1, 0)


async def test_without_a_budget_a_claim_counts_nothing(env: Env) -> None:
    sid = env.add("agent-a", T0 - timedelta(hours=1), schedule_type="interval", value="1h")
    await deliver_at(env, sid, T0 - timedelta(hours=1), then=T0)
    [row] = await env.ds.claim("A", T0, T0 + LEASE, limit=1)
    assert row.day == DayCount(0, 0, 0, 0)


async def test_a_pass_through_send_counts_in_a_claims_day_and_a_live_claim_in_its_own(sql_env: Env) -> None:
    from promptyoself.store.passthrough import BudgetReached, record_send

    env = sql_env
    assert env.store is not None
    record_send(env.store, "agent-a", "/v1/agents/agent-a/messages", T0 - timedelta(minutes=5), budget=0, since=DAY)
    sid = env.add("agent-a", T0)
    env.budget.cap = 2
    [row] = await env.ds.claim("A", T0, T0 + LEASE, limit=1)
    assert row.id == sid and row.day == DayCount(2, 1, 0, 0)
    # the claim's send is reserved: a pass-through send now would be the agent's third today
    with pytest.raises(BudgetReached) as full:
        record_send(env.store, "agent-a", "/v1/agents/agent-a/messages", T0, budget=2, since=DAY)
    assert full.value.used == 2
    await env.ds.release("A", [sid])
    assert record_send(env.store, "agent-a", "/v1/agents/agent-a/messages", T0, budget=2, since=DAY) == 1


async def test_recurring_schedules_ahead_are_rearmed_only_where_unchanged(env: Env) -> None:
    ahead = env.add("agent-a", T0 + timedelta(hours=2), schedule_type="interval", value="1h")
    env.add("agent-b", T0 + timedelta(hours=2))  # one-time: not re-armed
    rows = await env.ds.recurring_ahead(T0, 0, 10)
    assert [r[0] for r in rows] == [ahead]
    new = T0 + timedelta(minutes=30)
    assert await env.ds.rearm([(ahead, T0 + timedelta(hours=1), new, None)], T0) == 0  # not its slot any more
    assert await env.ds.rearm([(ahead, T0 + timedelta(hours=2), new, new)], T0) == 1
    assert env.row(ahead).next_run == new and env.row(ahead).due_at == new


async def test_the_due_summary_counts_active_and_due_and_names_the_oldest(env: Env) -> None:
    assert await env.ds.due_summary(T0) == Backlog(0, 0, None, None)
    env.add("agent-a", T0 - timedelta(minutes=2))
    env.add("agent-b", T0 - timedelta(minutes=1))
    env.add("agent-c", T0 + timedelta(minutes=5))
    env.add("agent-d", T0 - timedelta(hours=1), state="paused")
    assert await env.ds.due_summary(T0) == Backlog(3, 2, T0 - timedelta(minutes=2), T0 - timedelta(minutes=2))


async def test_an_agent_claimed_in_another_schema_of_the_database_is_not_held_here(tmp_path: Path) -> None:
    """PostgreSQL's advisory locks are the whole database's. Keyed on the agent alone, a claim for
    ``agent-a`` in another schema (another install, or a parallel test) made this schema's claim skip
    its own ``agent-a`` (``pg_try_advisory_xact_lock`` failed): the flaky receipts test above. The
    key names the schema too."""
    from promptyoself.store.claims import claim_due_in
    from tests.pg import pg_schema, require_pg

    require_pg()
    with opened("postgresql", tmp_path) as env, pg_schema() as other_url:
        other = Store(other_url)
        try:
            add_schedule(other, "agent-a", "theirs", T0)
            sid = env.add("agent-a", T0)
            with other.engine.begin() as conn:  # the other schema's claim of its agent-a, not committed yet
                assert len(claim_due_in(conn, "other", T0, T0 + LEASE, limit=5)) == 1
                assert [r.id for r in await env.ds.claim("A", T0, T0 + LEASE, limit=5)] == [sid]
        finally:
            other.close()


async def test_the_health_snapshot_reads_what_health_needs_in_one_go(env: Env) -> None:
    """``health_snapshot`` (``core/health.py``'s reads): the same answer from every store."""
    empty = await env.ds.health_snapshot(T0, 50)
    assert (empty.backlog, empty.lease, empty.targets, empty.recent) == (Backlog(0, 0, None, None), None, {}, [])
    assert (empty.unclaimed.count, empty.queued.count, empty.waiting.count) == (0, 0, 0)
    held = env.add("agent-a", T0 - timedelta(minutes=10), claimed_by="w", claim_until=T0 + LEASE)
    env.add("agent-a", T0 - timedelta(minutes=5))  # behind agent-a's live claim: queued
    env.add("agent-b", T0 - timedelta(minutes=3))  # its agent is free: waits for a send slot
    env.add("agent-c", T0 + timedelta(minutes=10), attempt=1, next_run=T0 - timedelta(minutes=2))  # a retry
    env.add("agent-d", T0 + timedelta(hours=2), target="other")
    env.add("agent-e", T0 - timedelta(hours=1), state="paused")
    snap = await env.ds.health_snapshot(T0, 50)
    assert snap.backlog == Backlog(5, 3, T0 - timedelta(minutes=10), T0 - timedelta(minutes=10))
    assert snap.targets == {"letta": (4, 3), "other": (1, 0)}
    assert (snap.unclaimed.count, snap.unclaimed.oldest_due, snap.unclaimed.target) == (
        1, T0 - timedelta(minutes=3), "letta")
    assert (snap.queued.count, snap.queued.oldest_due, snap.queued.target) == (1, T0 - timedelta(minutes=5), "letta")
    assert (snap.waiting.count, snap.waiting.oldest) == (1, T0 - timedelta(minutes=2))
    assert snap.lease is None and snap.recent == []
    await env.ds.record([outcome(env, held, "w", "failed", at=T0, state="failed", due_at=None)])
    recent = (await env.ds.health_snapshot(T0, 50)).recent
    assert [(o, at) for o, at, _ in recent] == [("failed", T0)]
    await env.ds.write_probe()  # a store that takes writes says nothing
    assert (await env.ds.describe()).startswith("memory" if env.store is None else env.store.url.split(":")[0])
