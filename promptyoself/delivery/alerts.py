"""Alerts for the operator (issue 43 point 4): what raises one, and the task that POSTs them.

Three things raise an alert, each written to the ``alerts`` table (``store.alerts``) once:

* ``schedule_paused``: delivery paused a schedule (``failed`` occurrences in a row reached the
  policy's ``pause_after_failures``, or the target said the agent or endpoint is gone). A person's
  pause raises none. Written in the same transaction as the pause (``Outcome.alerts``).
* ``over_budget``: an agent's first occurrence held by a budget in a budget day (one per agent per
  day, whatever holds the others). Written with that occurrence's history row.
* ``target_unready``: a target stopped answering (a send failed as unavailable, or the target
  refused our credentials). One per outage: closed by the target's next delivery.

Each shows in the console's banner and in ``/metrics`` (``promptyoself_alerts_total{kind}``), and when
the operator set ``PROMPTYOSELF_ALERT_URL`` and ``PROMPTYOSELF_ALERT_SECRET``, ``run_alert_sender`` (a
task of every delivery loop) POSTs it, signed as the webhook target signs (Standard Webhooks,
``webhook-id`` = the alert's id, the same on every retry), retried with backoff; it never holds up a
delivery (its own task, its own HTTP client; the store's calls are awaited, never run on the loop).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from promptyoself import timing
from promptyoself.delivery.retry import UNAVAILABLE_PREFIXES
from promptyoself.store.records import AlertRow

log = logging.getLogger(__name__)

SCHEDULE_PAUSED, OVER_BUDGET, TARGET_UNREADY = "schedule_paused", "over_budget", "target_unready"
KINDS = (SCHEDULE_PAUSED, OVER_BUDGET, TARGET_UNREADY)
EVENT_TYPE = "promptyoself.alert"
SEND_BATCH = 20
SEND_CLAIM = timedelta(seconds=60)
"""How long a loop holds the alerts it is POSTing (another loop takes them after that)."""
MAX_AGE = timedelta(days=1)
"""An alert not sent within this (no endpoint then, or it kept failing) is not sent any more."""
BACKOFF_BASE, BACKOFF_MAX = 5.0, 600.0
POLL = 5.0
"""Seconds between the sender's looks at the table when nothing woke it."""


@dataclass(frozen=True)
class AlertRules:
    """What the recorder knows when it decides an outcome's alerts: the policy's
    ``pause_after_failures`` (0 = never) and the budget day (``PROMPTYOSELF_TIMEZONE``) as a date."""

    pause_after: int
    budget_day: str


def alert_id(key: str) -> str:
    """The alert's id, fixed by what it is about (``key``): a second writer's insert does nothing."""
    return "alert_" + hashlib.sha256(key.encode()).hexdigest()[:32]


def row(key: str, kind: str, message: str, now: datetime, *, schedule_id: int | None = None,
        agent_id: str | None = None, target: str | None = None) -> dict[str, Any]:
    return {"id": alert_id(key), "kind": kind, "message": message[:2000], "schedule_id": schedule_id,
            "agent_id": agent_id, "target": target, "created_at": now}


def for_outcome(schedule_id: int, agent_id: str, target: str, kind: str, slot: datetime, was: str,
                change: dict[str, Any], rules: AlertRules | None, now: datetime) -> tuple[dict[str, Any], ...]:
    """The alerts an attempt's outcome raises (pure): delivery paused an active schedule; an agent's
    first ``over_budget`` of its budget day."""
    out: list[dict[str, Any]] = []
    if change.get("state") == "paused" and was == "active":
        out.append(row(f"paused:{schedule_id}:{timing.to_utc_iso(slot)}", SCHEDULE_PAUSED,
                       f"Schedule {schedule_id} (agent {agent_id}, target {target}) was paused by delivery: "
                       f"{change.get('last_error') or 'no reason given'}", now,
                       schedule_id=schedule_id, agent_id=agent_id, target=target))
    if kind == OVER_BUDGET and rules is not None:
        out.append(row(f"over_budget:{agent_id}:{rules.budget_day}", OVER_BUDGET,
                       f"Agent {agent_id}'s prompts are held by a budget today ({rules.budget_day}); the first "
                       f"held was schedule {schedule_id}'s: {change.get('last_error') or 'over budget'}", now,
                       schedule_id=schedule_id, agent_id=agent_id, target=target))
    return tuple(out)


def unready(outcome: str, error: str | None, auth_error: bool) -> bool:
    """Whether an attempt says its target does not answer (unavailable, or it refused our credentials)."""
    return auth_error or (outcome == "retry" and any(p in (error or "") for p in UNAVAILABLE_PREFIXES))


def target_rows(seen: Iterable[tuple[str, str, str | None, bool]], now: datetime,
                ) -> tuple[list[dict[str, Any]], set[str]]:
    """From a batch's ``(target, outcome, error, auth_error)``: the ``target_unready`` alerts to raise
    (one per target, unless one is open) and the targets that delivered (their alert is closed)."""
    down: dict[str, str] = {}
    up: set[str] = set()
    for target, outcome, error, auth in seen:
        if unready(outcome, error, auth):
            down.setdefault(target, error or "refused")
        elif outcome == "delivered":
            up.add(target)
    rows = [row(f"{TARGET_UNREADY}:{t}:{timing.to_utc_iso(now)}", TARGET_UNREADY,
                f"Target {t} does not answer; prompts to it wait and are retried. The last error: {e}", now,
                target=t) for t, e in down.items() if t not in up]
    return rows, up


async def alert_rules(core: Any, now: datetime) -> AlertRules | None:
    """The rules a batch is recorded with (the policy read at most once a second); None when the policy
    cannot be read (the batch is still recorded, without a pause or an alert)."""
    try:
        pause_after = int((await core.recent_policy(now)).pause_after_failures)
        day = timing.day_start(now, core.settings.timezone).astimezone(core.settings.timezone).date().isoformat()
    except Exception:
        log.exception("reading the alert rules failed; recording without them")
        return None
    return AlertRules(pause_after, day)


_quiet: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
"""Per delivery store, the targets this process knows have no open ``target_unready`` alert (so a
delivery to them writes nothing). A target another process saw go down is closed by the next delivery
of that process, or of this one once it saw the target down too."""


async def target_alerts(core: Any, batch: Iterable[Any], now: datetime) -> None:
    """After a batch is recorded: a ``target_unready`` alert for each target that failed to answer (one
    per outage), and the open alert of each target that delivered closed. Never raises."""
    try:
        store = core.deliveries
        seen = [(a.claim.target, a.kind, a.error, a.auth_error) for a in batch]
        raise_rows, up = target_rows(seen, now)
        quiet = _quiet.setdefault(store, set())
        for r in raise_rows:
            quiet.discard(r["target"])
            if await store.raise_target_alert(r):
                log.warning("alert: %s", r["message"])
        for t in up - quiet:
            await store.close_target_alerts(t, now)
            quiet.add(t)
    except Exception:
        log.exception("recording a target's alert failed; delivery goes on")


def backoff(attempts: int) -> float:
    """Seconds before an alert's next POST after ``attempts`` failed ones."""
    return float(min(BACKOFF_MAX, BACKOFF_BASE * 2 ** max(0, attempts - 1)))


def event_body(alert: AlertRow, sent_at: datetime) -> bytes:
    """The JSON body (compact, fixed key order: the signed bytes)."""
    event = {
        "type": EVENT_TYPE,
        "timestamp": timing.to_utc_iso(sent_at),
        "data": {"alert_id": alert.id, "kind": alert.kind, "message": alert.message,
                 "schedule_id": alert.schedule_id, "agent_id": alert.agent_id, "target": alert.target,
                 "created_at": timing.to_utc_iso(alert.created_at)},
    }
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()


class AlertSender:
    """POSTs the pending alerts to the operator's endpoint, each signed (``standardwebhooks``), once
    per alert id; a failed POST is tried again after ``backoff``. The store's verbs are awaited
    (``DeliveryStore``: the SQL store runs them in its own threads, never on the event loop)."""

    def __init__(self, deliveries: Any, url: str, secret: str, now: Callable[[], datetime], *,
                 timeout: float = 10.0, transport: Any = None) -> None:
        self.deliveries, self.url, self.secret, self.now = deliveries, url, secret, now
        self.timeout, self.transport = timeout, transport
        self._http: Any = None

    async def send_due(self) -> int:
        """POST every alert due now; how many were sent."""
        now = self.now()
        due: list[AlertRow] = await self.deliveries.alerts_to_send(now, now + SEND_CLAIM, SEND_BATCH, now - MAX_AGE)
        sent = 0
        for alert in due:
            error = await self._post(alert)
            if error is None:
                await self.deliveries.alert_sent(alert.id, self.now())
                sent += 1
                continue
            tries = alert.send_attempts + 1
            at = self.now() + timedelta(seconds=backoff(tries))
            retry_at = None if at - alert.created_at > MAX_AGE else at
            log.warning("alert %s: POST failed (%s); %s", alert.id, error,
                        "giving up" if retry_at is None else f"again in {backoff(tries):.0f}s")
            await self.deliveries.alert_send_failed(alert.id, error, retry_at)
        return sent

    async def _post(self, alert: AlertRow) -> str | None:
        import httpx
        from standardwebhooks.webhooks import Webhook

        from promptyoself import __version__
        from promptyoself.config import redact_url

        if self._http is None:
            self._http = httpx.AsyncClient(headers={"User-Agent": f"promptyoself/{__version__}"},
                                           timeout=self.timeout, transport=self.transport, follow_redirects=False)
        sent_at = datetime.now(UTC).replace(microsecond=0)  # the wire's time (receivers check it), as the
        # webhook target signs, whatever clock the engine runs on
        body = event_body(alert, sent_at)
        headers = {"content-type": "application/json", "webhook-id": alert.id,
                   "webhook-timestamp": str(int(sent_at.timestamp())),
                   "webhook-signature": Webhook(self.secret).sign(alert.id, sent_at, body.decode())}
        try:
            async with asyncio.timeout(self.timeout):
                resp = await self._http.post(self.url, content=body, headers=headers)
        except (TimeoutError, httpx.HTTPError) as exc:
            return f"{redact_url(self.url)} could not be reached ({type(exc).__name__})"
        if 200 <= resp.status_code < 300:
            return None
        return f"{redact_url(self.url)} answered HTTP {resp.status_code}"

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


async def run_alert_sender(core: Any, wake: asyncio.Event | None = None, *, poll: float = POLL) -> None:
    """A task of the delivery loop: while the alert endpoint is configured, POST what is due every
    ``poll`` seconds (or when ``wake`` is set); a failure is logged, never raised (alerts never stop
    delivery). Nothing to do without ``PROMPTYOSELF_ALERT_URL``: it returns at once."""
    endpoint = core.settings.alert_endpoint
    if endpoint is None:
        return
    sender = AlertSender(core.deliveries, endpoint[0], endpoint[1], core.now,
                         timeout=float(core.settings.letta_timeout))
    try:
        while True:
            try:
                await sender.send_due()
            except Exception:
                log.exception("sending alerts failed; trying again later")
            if wake is None:
                await asyncio.sleep(poll)
                continue
            try:
                async with asyncio.timeout(poll):
                    await wake.wait()
            except TimeoutError:
                pass
            wake.clear()
    finally:
        await sender.aclose()
