"""``MemoryDeliveryStore``: the ``DeliveryStore`` contract in memory (issue 30 point 3), for the
engine's fast tests: claims, fences (``claim_until``), compare-and-set on ``(id, next_run)``, one live
claim per agent, lost and stale outcomes, claims in the recording transaction. One lock stands for
the database's write transaction; the rows are the same frozen ``ScheduleRow`` records the SQL store
hands out, and history rows are the ``deliveries`` columns as dicts. No clock of its own: every time
is an argument, as for the SQL store. Its verbs are coroutines as the interface's are, run on the
event loop itself (no thread: it is memory); the seeding and reading helpers are plain methods."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Any, Unpack

from promptyoself.config import Settings
from promptyoself.store import LIVE_STATES
from promptyoself.store import policy as stored_policy
from promptyoself.store.agent_tokens import AgentTokenRow
from promptyoself.store.claims import ClaimAsk, ClaimReport, Outcome, Recorded, fit_targets
from promptyoself.store.day_counts import count_in_memory
from promptyoself.store.delivery_store import ClaimOptions, DayAsker, Rearm, RecurringRow
from promptyoself.store.health import WAIT_HORIZON, Backlog, HealthSnapshot, Unclaimed, Waiting
from promptyoself.store.operator import NOTICE_WINDOW, Recent
from promptyoself.store.policy import Policy
from promptyoself.store.receipts import PENDING, LastTurn, PendingRow
from promptyoself.store.records import (
    AlertRow,
    DayAsk,
    DeliveryRow,
    ListedSchedule,
    ScheduleRow,
    column_names,
)
from promptyoself.store.retention import Purged
from promptyoself.store.schedules import (
    RULE_STATES,
    CreationLimits,
    DuplicateKey,
    HourlyLimitReached,
    QuotaReached,
    RulesChanged,
)
from promptyoself.store.timeline import Attempts


class MemoryDeliveryStore:
    def __init__(self, *, day: DayAsker | None = None) -> None:
        self.day = day
        self._lock = threading.Lock()
        self.rows: dict[int, ScheduleRow] = {}
        self.history: list[dict[str, Any]] = []
        self.alerts: dict[str, dict[str, Any]] = {}
        """Alerts by id (``store.alerts``' columns as dicts)."""
        self.policy_rows: dict[str, stored_policy.Entry] = {}
        """The operator's policy values (``save_policy``); the others are the settings' seeds."""
        self.tokens: list[dict[str, Any]] = []
        """Agent tokens (``store.agent_tokens``' columns as dicts), by id."""
        self._last_ids = {"schedule": 0, "history": 0}
        """The highest id handed out of each: as the database's, an id is never given again, even after
        its row was deleted (a receipt's ``after_id``, an alert's schedule id stay unambiguous)."""

    # ---- seeding and reading (what the core would have written) ----------------------------------

    def add(self, agent_id: str, prompt_text: str, due: datetime, **columns: Any) -> int:
        """A schedule due at ``due`` (``next_run`` and ``due_at``); other columns as given."""
        with self._lock:
            sid = self._new_id("schedule")
            values: dict[str, Any] = {"schedule_type": "once", "schedule_value": "", "timezone": "UTC",
                                      "next_run": due, "due_at": due, "created_at": due, "updated_at": due}
            self.rows[sid] = ScheduleRow(**{**values, **columns, "id": sid, "agent_id": agent_id,
                                            "prompt_text": prompt_text})
            return sid

    def add_history(self, **columns: Any) -> int:
        """A history row (``deliveries``' columns) as delivery would have recorded it; its id."""
        with self._lock:
            self._add_history([columns])
            return int(self.history[-1]["id"])

    def get(self, sid: int) -> ScheduleRow:
        with self._lock:
            return self.rows[sid]

    def outcomes(self, sid: int | None = None) -> list[str]:
        with self._lock:
            return [h["outcome"] for h in self.history if sid is None or h["schedule_id"] == sid]

    # ---- the contract ----------------------------------------------------------------------------

    def _live(self, row: ScheduleRow, now: datetime) -> bool:
        return row.claimed_by is not None and row.claim_until is not None and row.claim_until >= now

    def _claimable(self, row: ScheduleRow, now: datetime) -> bool:
        return (row.state == "active" and row.due_at is not None and row.due_at <= now
                and not self._live(row, now))

    def _busy_agents(self, now: datetime) -> set[str]:
        return {r.agent_id for r in self.rows.values() if self._live(r, now)}

    def _due(self, now: datetime, exclude_agents: Collection[str],
             exclude_ids: Collection[int] = ()) -> list[ScheduleRow]:
        """Each free agent's earliest claimable row (due time, then id), oldest first."""
        busy = self._busy_agents(now) | set(exclude_agents)
        first: dict[str, ScheduleRow] = {}
        claimable = [r for r in self.rows.values() if self._claimable(r, now)]
        for row in sorted(claimable, key=lambda r: (r.due_at, r.id)):
            if row.agent_id not in busy and row.agent_id not in first and row.id not in exclude_ids:
                first[row.agent_id] = row
        return sorted(first.values(), key=lambda r: (r.due_at, r.id))

    async def next_due(self, now: datetime, exclude_agents: Collection[str] = (),
                       exclude_targets: Collection[str] = ()) -> datetime | None:
        """(Agents with a live claim elsewhere are not left out: their rows' due times still count.)"""
        with self._lock:
            due = [r.due_at for r in self.rows.values() if r.state == "active" and r.due_at is not None
                   and r.agent_id not in exclude_agents and r.target not in exclude_targets
                   and not self._live(r, now)]
            return min(due, default=None)

    async def claim(self, owner: str, now: datetime, until: datetime, *, limit: int,
                    **options: Unpack[ClaimOptions]) -> list[ScheduleRow]:
        ask = await self.day(now) if self.day else None
        with self._lock:
            return self._claim(owner, now, until, limit, ask, **options)

    def _claim(self, owner: str, now: datetime, until: datetime, limit: int, ask: DayAsk | None,
               **options: Unpack[ClaimOptions]) -> list[ScheduleRow]:
        if limit <= 0:
            return []
        want = limit + max(2, limit // 2)
        targets = options.get("targets")
        full = set(targets.full()) if targets is not None else set()
        candidates = [r for r in self._due(now, options.get("exclude_agents") or (), options.get("exclude_ids") or ())
                      if r.target not in full][:want]
        report, taken_over = options.get("report"), options.get("taken_over")
        if report is not None:
            report.more_due = len(candidates) >= want
        out = []
        for row in fit_targets(candidates, targets, lambda r: r.target)[:limit]:
            if taken_over is not None and row.claimed_by is not None:
                taken_over.add(row.id)
            self.rows[row.id] = claimed = dataclasses.replace(row, claimed_by=owner, claim_until=until)
            if ask is not None:  # what store.day_counts.with_days reads in the claim's transaction
                claimed = dataclasses.replace(claimed, day=count_in_memory(self.history, row, ask, now))
            out.append(claimed)
        return out

    async def renew(self, owner: str, ids: Collection[int], until: datetime) -> set[int]:
        with self._lock:
            held = {i for i in ids if i in self.rows and self.rows[i].claimed_by == owner}
            for i in held:
                self.rows[i] = dataclasses.replace(self.rows[i], claim_until=until)
            return held

    async def release(self, owner: str, ids: Collection[int]) -> int:
        with self._lock:
            held = [i for i in ids if i in self.rows and self.rows[i].claimed_by == owner]
            for i in held:
                self.rows[i] = dataclasses.replace(self.rows[i], claimed_by=None, claim_until=None)
            return len(held)

    async def record(self, outcomes: Collection[Outcome], *, claim: ClaimAsk | None = None) -> Recorded:
        written: set[int] = set()
        lost: set[int] = set()
        fresh: dict[int, ScheduleRow] = {}
        ask = await self.day(claim.now) if self.day and claim is not None else None
        with self._lock:
            for o in outcomes:
                row = self.rows.get(o.schedule_id)
                if row is None or row.claimed_by != o.owner or row.next_run != o.slot:
                    lost.add(o.schedule_id)
                    self._add_history(o.lost_history)
                elif any(getattr(row, col) != value for col, value in o.basis):
                    fresh[o.schedule_id] = row
                else:
                    written.add(o.schedule_id)
                    self._add_history(o.history)
                    self.rows[o.schedule_id] = dataclasses.replace(row, **o.change)
                    for alert in o.alerts:  # as store.alerts.add: an alert already raised stays as it is
                        self.alerts.setdefault(alert["id"], self._alert(alert))
            claimed: list[ScheduleRow] = []
            taken: set[int] = set()
            report = ClaimReport()
            if claim is not None:
                claimed = self._claim(claim.owner, claim.now, claim.until, claim.limit, ask,
                                      exclude_agents=claim.exclude_agents, targets=claim.targets, taken_over=taken,
                                      report=report)
        return Recorded(frozenset(written), frozenset(lost), fresh, tuple(claimed), frozenset(taken), report.more_due)

    def _add_history(self, rows: Collection[dict[str, Any]]) -> None:
        for row in rows:
            self.history.append({"id": self._new_id("history"), **row})

    def _new_id(self, table: str) -> int:
        self._last_ids[table] += 1
        return self._last_ids[table]

    async def resume_waiting(self, now: datetime) -> int:
        with self._lock:
            moved = 0
            for sid, r in list(self.rows.items()):
                error = r.last_error or ""
                if (r.state == "active" and r.attempt > 0 and r.claimed_by is None and r.due_at is not None
                        and r.due_at > now and error.startswith(("target_unavailable", "letta_unavailable"))
                        and "HTTP 429" not in error):
                    self.rows[sid] = dataclasses.replace(r, due_at=now)
                    moved += 1
            return moved

    async def count_attempts_with_error(self, schedule_id: int, scheduled_for: datetime, prefix: str) -> int:
        with self._lock:
            return sum(1 for h in self.history if h["schedule_id"] == schedule_id
                       and h["scheduled_for"] == scheduled_for and (h.get("error") or "").startswith(prefix))

    async def recent(self, since: datetime, cap: int, *, agent_id: str | None = None,
                     schedule_id: int | None = None, spend: bool = False, until: datetime | None = None) -> Recent:
        key, value = ("schedule_id", schedule_id) if schedule_id is not None else ("agent_id", agent_id)
        with self._lock:
            mine = [h for h in self.history if h[key] == value]
        today = [h for h in mine if h["outcome"] == "delivered" and h["attempted_at"] >= since]
        tokens, cost = _spent(today, until) if spend and key == "agent_id" else (0, 0.0)
        return Recent(min(cap, len(today)), _unannounced(mine), tokens, cost)

    async def recurring_ahead(self, now: datetime, after_id: int, limit: int) -> list[RecurringRow]:
        with self._lock:
            rows = [r for sid, r in sorted(self.rows.items()) if sid > after_id and r.state == "active"
                    and r.schedule_type != "once" and r.claimed_by is None and r.next_run is not None
                    and r.next_run > now]
        return [(r.id, r.schedule_type, r.schedule_value, r.timezone, r.anchor, r.next_run) for r in rows[:limit]]

    async def rearm(self, changes: list[Rearm], now: datetime) -> int:
        moved = 0
        with self._lock:
            for sid, old, new, anchor in changes:
                r = self.rows.get(sid)
                if r is None or r.next_run != old or r.claimed_by is not None or r.state != "active":
                    continue
                values: dict[str, Any] = {"next_run": new, "due_at": new, "updated_at": now}
                if anchor is not None:
                    values["anchor"] = anchor
                self.rows[sid] = dataclasses.replace(r, **values)
                moved += 1
        return moved

    async def due_summary(self, now: datetime) -> Backlog:
        with self._lock:
            active = [r for r in self.rows.values() if r.state == "active"]
        due = [r for r in active if r.due_at is not None and r.due_at <= now]
        slots = [r.next_run or r.due_at for r in due]
        return Backlog(len(active), len(due), min((s for s in slots if s is not None), default=None),
                       min((r.due_at for r in active if r.due_at is not None), default=None))

    async def pending_receipts(self, limit: int, after_id: int = 0) -> list[PendingRow]:
        with self._lock:
            rows = [h for h in self.history if h.get("receipt_state") == PENDING and h["id"] > after_id][:limit]
            return [PendingRow(h["id"], h["schedule_id"], h["agent_id"], self.rows[h["schedule_id"]].target,
                               h.get("letta_run_id"), h["attempted_at"], h.get("receipt")) for h in rows]

    async def last_turn(self, schedule_id: int) -> LastTurn | None:
        with self._lock:
            for h in reversed(self.history):
                if h["schedule_id"] == schedule_id and h["outcome"] == "delivered":
                    return LastTurn(h.get("letta_run_id"), h["attempted_at"], h.get("receipt"))
        return None

    async def complete_receipt(self, delivery_id: int, state: str, receipt: str, *, tokens: int | None = None,
                               cost_usd: float | None = None) -> bool:
        with self._lock:
            for h in self.history:
                if h["id"] == delivery_id and h.get("receipt_state") == PENDING:
                    h.update(receipt_state=state, receipt=receipt, tokens=tokens, cost_usd=cost_usd)
                    return True
            return False

    # ---- alerts (store.alerts' contract) ---------------------------------------------------------

    def _alert(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"send_state": "pending", "send_attempts": 0, "closed_at": None, "seen_at": None,
                "next_send_at": row["created_at"], "sending_until": None, "sent_at": None, "send_error": None,
                "schedule_id": None, "agent_id": None, "target": None, **row}

    async def raise_target_alert(self, row: dict[str, Any]) -> bool:
        with self._lock:
            if any(a["kind"] == "target_unready" and a["target"] == row["target"] and a["closed_at"] is None
                   for a in self.alerts.values()):
                return False
            self.alerts.setdefault(row["id"], self._alert(row))
            return True

    async def close_target_alerts(self, target: str, now: datetime) -> int:
        with self._lock:
            open_ = [a for a in self.alerts.values()
                     if a["kind"] == "target_unready" and a["target"] == target and a["closed_at"] is None]
            for a in open_:
                a["closed_at"] = now
            return len(open_)

    async def alerts_to_send(self, now: datetime, until: datetime, limit: int, oldest: datetime) -> list[AlertRow]:
        with self._lock:
            out: list[AlertRow] = []
            for a in sorted(self.alerts.values(), key=lambda x: x["created_at"]):
                full = self._alert(a)
                a.update(full)
                if a["send_state"] != "pending":
                    continue
                if a["created_at"] < oldest:
                    a["send_state"] = "expired"
                    continue
                if a["next_send_at"] <= now and (a["sending_until"] is None or a["sending_until"] < now) \
                        and len(out) < limit:
                    a["sending_until"] = until
                    out.append(AlertRow(**{n: a[n] for n in column_names(AlertRow)}))
            return out

    async def alert_sent(self, alert_id: str, now: datetime) -> None:
        with self._lock:
            self.alerts[alert_id].update(send_state="sent", sent_at=now, sending_until=None, send_error=None,
                                         send_attempts=self.alerts[alert_id]["send_attempts"] + 1)

    async def alert_send_failed(self, alert_id: str, error: str, retry_at: datetime | None) -> None:
        with self._lock:
            a = self.alerts[alert_id]
            a.update(send_state="pending" if retry_at is not None else "failed", next_send_at=retry_at,
                     sending_until=None, send_error=error[:500], send_attempts=a["send_attempts"] + 1)


    # ---- the core's verbs (``DeliveryStore``'s last section): the same rows the engine claims ----------

    async def policy(self, settings: Settings, now: datetime, *, max_age: float = 0.0) -> Policy:
        with self._lock:
            return stored_policy.of_settings(settings, now, self.policy_rows)

    async def schedule(self, schedule_id: int) -> ScheduleRow | None:
        with self._lock:
            return self.rows.get(schedule_id)

    async def schedule_by_key(self, agent_id: str, key: str) -> ScheduleRow | None:
        with self._lock:
            return self._by_key(agent_id, key)

    def _by_key(self, agent_id: str, key: str) -> ScheduleRow | None:
        return next((r for r in self.rows.values() if r.agent_id == agent_id and r.idempotency_key == key), None)

    async def count_live(self, agent_id: str) -> int:
        with self._lock:
            return self._count_live(agent_id)

    def _count_live(self, agent_id: str) -> int:
        return sum(1 for r in self.rows.values() if r.agent_id == agent_id and r.state in LIVE_STATES)

    def _rules(self, agent_id: str, states: tuple[str, ...]) -> list[ScheduleRow]:
        return [r for _, r in sorted(self.rows.items())
                if r.agent_id == agent_id and r.state in states and r.schedule_type != "once"]

    def _made_since(self, agent_id: str, since: datetime, cap: int) -> list[datetime]:
        """The creation times at or after ``since`` among the agent's newest ``cap`` schedules."""
        newest = sorted((r for r in self.rows.values() if r.agent_id == agent_id), key=lambda r: r.id)[-cap:]
        return [r.created_at for r in newest if r.created_at >= since]

    async def create_schedule(self, new: ScheduleRow, limits: CreationLimits) -> ScheduleRow:
        with self._lock:  # the database's transaction: counted and written with no other writer between
            if limits.per_hour and limits.hour_since is not None:
                made = self._made_since(new.agent_id, limits.hour_since, limits.per_hour)
                if len(made) >= limits.per_hour:
                    raise HourlyLimitReached(len(made), min(made, default=None))
            if limits.rules_seen is not None:
                rules = self._rules(new.agent_id, RULE_STATES)
                if (len(rules), max((r.id for r in rules), default=0)) != limits.rules_seen:
                    raise RulesChanged()
            if limits.max_live is not None and (live := self._count_live(new.agent_id)) >= limits.max_live:
                raise QuotaReached(live)
            if new.idempotency_key is not None and self._by_key(new.agent_id, new.idempotency_key) is not None:
                raise DuplicateKey(f"agent {new.agent_id} already has idempotency_key {new.idempotency_key!r}")
            sid = self._new_id("schedule")
            row = dataclasses.replace(new, id=sid, claimed_by=None, claim_until=None, last_error=None,
                                      failures_in_row=0)  # what only delivery writes (INSERTED_BY_DELIVERY)
            self.rows[sid] = row
            return row

    async def replace_schedule(self, before: ScheduleRow, after: ScheduleRow) -> bool:
        changed = {n: getattr(after, n) for n in column_names(ScheduleRow)
                   if n != "id" and getattr(after, n) != getattr(before, n)}
        if not changed:
            return True
        with self._lock:
            now = self.rows.get(before.id)
            if now is None:
                return False
            claim: dict[str, Any] = {"claimed_by": now.claimed_by, "claim_until": now.claim_until}
            if dataclasses.replace(now, **claim) != dataclasses.replace(before, **claim):
                return False  # the schedule changed meanwhile (its claim's columns aside)
            self.rows[before.id] = dataclasses.replace(now, **changed)
            return True

    async def recurring_of(self, agent_id: str, states: tuple[str, ...]) -> list[ScheduleRow]:
        with self._lock:
            return self._rules(agent_id, states)

    async def created_since(self, agent_id: str, since: datetime, cap: int) -> int:
        with self._lock:
            return len(self._made_since(agent_id, since, cap))

    async def agent_day(self, agent_id: str, since: datetime, cap: int, until: datetime) -> Recent:
        return await self.recent(since, cap, agent_id=agent_id, spend=True, until=until)

    async def list_page(self, agent_id: str | None, include_ended: bool, limit: int,
                        offset: int) -> tuple[list[ListedSchedule], int]:
        with self._lock:
            rows = [r for _, r in sorted(self.rows.items()) if (agent_id is None or r.agent_id == agent_id)
                    and (include_ended or r.state in LIVE_STATES)]
        return list(rows[offset:offset + limit]), len(rows)

    async def deliveries(self, *, schedule_id: int | None, agent_id: str | None, limit: int) -> list[DeliveryRow]:
        key, value = ("schedule_id", schedule_id) if schedule_id is not None else ("agent_id", agent_id)
        with self._lock:
            rows = [h for h in reversed(self.history) if (key, value) == ("agent_id", None) or h[key] == value]
        return [DeliveryRow(**{n: h.get(n) for n in column_names(DeliveryRow)}) for h in rows[:limit]]

    # ---- the operator's verbs -------------------------------------------------------------------------

    async def save_policy(self, settings: Settings, changes: Mapping[str, int | float | timedelta | None],
                          now: datetime) -> Policy:
        with self._lock:
            for name, value in changes.items():
                self.policy_rows[name] = stored_policy.Entry(stored_policy.text_of(name, value),
                                                             stored_policy.OPERATOR, now)
            return stored_policy.of_settings(settings, now, self.policy_rows)

    async def outcomes_since(self, since: datetime, agent_id: str | None = None) -> dict[str, int]:
        with self._lock:
            rows = [h for h in self.history if h["attempted_at"] >= since
                    and (agent_id is None or h["agent_id"] == agent_id)]
        return dict(Counter(str(h["outcome"]) for h in rows))

    async def count_state(self, state: str) -> int:
        with self._lock:
            return sum(1 for r in self.rows.values() if r.state == state)

    async def spend_by_agent(self, since: datetime, until: datetime | None = None) -> dict[str, tuple[int, float]]:
        with self._lock:
            rows = [h for h in self.history if h["outcome"] == "delivered" and h["attempted_at"] >= since]
        out: dict[str, tuple[int, float]] = {}
        for agent in dict.fromkeys(h["agent_id"] for h in rows):
            out[agent] = _spent([h for h in rows if h["agent_id"] == agent], until)
        return out

    async def schedules_page(self, *, agent_id: str | None, states: tuple[str, ...], limit: int,
                             offset: int) -> tuple[list[ListedSchedule], int]:
        with self._lock:
            rows = [r for _, r in sorted(self.rows.items(), reverse=True)
                    if (agent_id is None or r.agent_id == agent_id) and (not states or r.state in states)]
        return list(rows[offset:offset + limit]), len(rows)

    async def last_deliveries(self, schedule_ids: list[int], per: int) -> dict[int, list[DeliveryRow]]:
        return {sid: await self.deliveries(schedule_id=sid, agent_id=None, limit=per) for sid in schedule_ids}

    async def agents_by_state(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for r in self.rows.values():
                states = out.setdefault(r.agent_id, {})
                states[r.state] = states.get(r.state, 0) + 1
        return out

    async def letta_page(self, agent_id: str, after: int | None, limit: int) -> list[ScheduleRow]:
        with self._lock:
            rows = [r for sid, r in sorted(self.rows.items()) if r.agent_id == agent_id
                    and r.letta_payload is not None and r.state in LIVE_STATES and (after is None or sid > after)]
        return rows[:limit]

    async def add_agent_token(self, agent_id: str, token_hash: str, hint: str, now: datetime, *,
                              revoke_others: bool = False) -> AgentTokenRow:
        with self._lock:  # the table's unique index on the hash, and the rotation's one transaction
            if any(t["token_hash"] == token_hash for t in self.tokens):
                raise ValueError("an agent token with this hash exists (the unique index)")
            if revoke_others:
                for t in self.tokens:
                    if t["agent_id"] == agent_id and t["revoked_at"] is None:
                        t["revoked_at"] = now
            row = {"id": len(self.tokens) + 1, "agent_id": agent_id, "token_hash": token_hash, "hint": hint,
                   "created_at": now, "revoked_at": None}
            self.tokens.append(row)
            return _token(row)

    async def token_agent(self, token_hash: str) -> str | None:
        with self._lock:
            return next((str(t["agent_id"]) for t in self.tokens
                         if t["token_hash"] == token_hash and t["revoked_at"] is None), None)

    async def agent_tokens(self, agent_id: str | None = None, *, include_revoked: bool = False,
                           limit: int = 500) -> list[AgentTokenRow]:
        with self._lock:
            rows = [t for t in reversed(self.tokens) if (agent_id is None or t["agent_id"] == agent_id)
                    and (include_revoked or t["revoked_at"] is None)]
        return [_token(t) for t in rows[:limit]]

    async def revoke_agent_tokens(self, now: datetime, *, agent_id: str | None = None,
                                  token_id: int | None = None) -> int:
        with self._lock:
            hit = [t for t in self.tokens if t["revoked_at"] is None and (agent_id is None or t["agent_id"] == agent_id)
                   and (token_id is None or t["id"] == token_id)]
            for t in hit:
                t["revoked_at"] = now
            return len(hit)

    # ---- health's verbs -------------------------------------------------------------------------------
    # A memory store has no database: no file, no worker lease (the engine of its own process delivers its
    # rows: ``Deps.delivery`` says whether it runs), nothing that could refuse a write.

    async def describe(self) -> str:
        return "memory (no database)"

    async def health_snapshot(self, now: datetime, recent: int) -> HealthSnapshot:
        with self._lock:
            rows = list(self.rows.values())
            newest = list(reversed(self.history[-recent:])) if recent > 0 else []
        active = [r for r in rows if r.state == "active"]
        due = [r for r in active if r.due_at is not None and r.due_at <= now]
        return HealthSnapshot(
            backlog=await self.due_summary(now), lease=None, targets=_by_target(active, now),
            unclaimed=_due_unheld(due, rows, now, agent_busy=False),
            queued=_due_unheld(due, rows, now, agent_busy=True), waiting=_waiting(active, now),
            recent=[(str(h["outcome"]), h["attempted_at"], h.get("error")) for h in newest])

    async def write_probe(self) -> None:
        return None  # memory takes every write: nothing to probe

    # ---- retention's and the timeline's verbs (``store.retention``, ``store.timeline``) --------------
    # Memory holds no pass-through sends (the database stores only count them): ``purge`` deletes none.

    async def purge(self, ended_before: datetime | None, history_before: datetime | None) -> Purged:
        schedules = history = 0
        with self._lock:
            if ended_before is not None:
                ended = {sid for sid, r in self.rows.items()
                         if r.state not in LIVE_STATES and r.updated_at < ended_before}
                for sid in ended:
                    del self.rows[sid]
                schedules = len(ended)
                history += self._drop_history(lambda h: h["schedule_id"] in ended)
            if history_before is not None:
                history += self._drop_history(lambda h: h["attempted_at"] < history_before)
        return Purged(schedules, history, 0)

    def _drop_history(self, gone: Callable[[dict[str, Any]], bool]) -> int:
        kept = [h for h in self.history if not gone(h)]
        dropped = len(self.history) - len(kept)
        self.history[:] = kept
        return dropped

    async def active_due_before(self, until: datetime, limit: int,
                                agent_id: str | None = None) -> list[ListedSchedule]:
        with self._lock:
            rows = [r for r in self.rows.values() if r.state == "active" and r.next_run is not None
                    and r.due_at is not None and r.due_at < until and (agent_id is None or r.agent_id == agent_id)]
        rows.sort(key=lambda r: (r.due_at, r.id))
        return list(rows[:limit])

    async def attempts_since(self, since: datetime, limit: int, agent_id: str | None = None) -> Attempts:
        with self._lock:  # the history list is in id order, as the SQL read's ORDER BY id
            rows = [(h["attempted_at"], str(h["outcome"])) for h in self.history
                    if h["attempted_at"] >= since and (agent_id is None or h["agent_id"] == agent_id)]
        return rows[:limit], len(rows) > limit


def _token(row: dict[str, Any]) -> AgentTokenRow:
    return AgentTokenRow(row["id"], row["agent_id"], row["hint"], row["created_at"], row["revoked_at"])


def _unannounced(history: list[dict[str, Any]]) -> int:
    """``over_budget`` rows since the newest delivered one (within ``NOTICE_WINDOW``)."""
    count = 0
    for h in reversed(history[-NOTICE_WINDOW:]):
        if h["outcome"] == "delivered":
            break
        count += h["outcome"] == "over_budget"
    return count


def _spent(delivered: list[dict[str, Any]], until: datetime | None) -> tuple[int, float]:
    """The tokens and USD the receipts of ``delivered`` reported, up to ``until``."""
    rows = [h for h in delivered if until is None or h["attempted_at"] <= until]
    return sum(h.get("tokens") or 0 for h in rows), sum(h.get("cost_usd") or 0.0 for h in rows)


def _by_target(active: list[ScheduleRow], now: datetime) -> dict[str, tuple[int, int]]:
    """``store.health.by_target`` over the active rows: ``{target: (active, due)}``."""
    out: dict[str, tuple[int, int]] = {}
    for r in active:
        n, d = out.get(r.target, (0, 0))
        out[r.target] = (n + 1, d + (r.due_at is not None and r.due_at <= now))
    return out


def _waiting(active: list[ScheduleRow], now: datetime) -> Waiting:
    """``store.health.waiting`` over the active rows: those waiting out a retry's backoff."""
    retry = [r for r in active if r.due_at is not None and now < r.due_at <= now + WAIT_HORIZON and r.attempt > 0]
    return Waiting(len(retry), min((r.next_run for r in retry if r.next_run is not None), default=None))


def _due_unheld(due: list[ScheduleRow], rows: list[ScheduleRow], now: datetime, *, agent_busy: bool) -> Unclaimed:
    """``store.health.unclaimed`` / ``queued`` over the rows: due rows no live claim holds, of agents that
    hold a live claim on another of their schedules (``agent_busy``) or not; the oldest by ``due_at``."""
    busy = {r.agent_id for r in rows if r.claimed_by is not None and r.claim_until is not None and r.claim_until >= now}
    free = sorted((r for r in due if (r.claimed_by is None or (r.claim_until is not None and r.claim_until < now))
                   and (r.agent_id in busy) == agent_busy), key=lambda r: (r.due_at, r.id))
    if not free:
        return Unclaimed(0, None, None)
    return Unclaimed(len(free), free[0].due_at, free[0].target)
