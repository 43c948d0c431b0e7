"""``/metrics``: Prometheus text through ``prometheus_client``, collected at scrape time.

Everything that lives in the database (deliveries by outcome, the lateness histogram, the due backlog,
the age of the oldest overdue occurrence, claims lost, Letta errors by kind) is read when Prometheus
scrapes, by a custom collector: the numbers are the same whichever process delivered, and no code on
the delivery path has to count anything. ``promptyoself_worker_up`` says whether a live delivery runs
for this database (a live worker lease, or this service's own loop).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from promptyoself.deps import Services
from promptyoself.store import PENDING_APPROVAL, alerts
from promptyoself.store import health as queries
from promptyoself.store.operator import count_state, outcomes_since, spend_by_agent
from promptyoself.store.policy import Policy, load
from promptyoself.targets import registry as targets_registry
from promptyoself.timing import day_start

log = logging.getLogger(__name__)

LATENESS_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class DeliveryCollector(Collector):
    def __init__(self, core: Services) -> None:
        self.core = core

    def collect(self) -> Iterator[Metric]:
        store, now = self.core.store, self.core.now()
        up = GaugeMetricFamily("promptyoself_database_up", "1 when the database answered this scrape.")
        try:
            bl = queries.backlog(store, now)
            outcomes = queries.delivery_outcomes(store)
            counts, total, late_sum = queries.lateness_buckets(store, LATENESS_BUCKETS)
            kinds = queries.letta_error_kinds(store)
            lost = queries.claims_lost(store)
            lease = queries.lease(store, now)
            targets = queries.by_target(store, now)
            pending = count_state(store, PENDING_APPROVAL)
            since = day_start(now, self.core.settings.timezone)
            today = outcomes_since(store, since)
            spend = spend_by_agent(store, since, now)
            policy = load(store, self.core.settings, now)
            raised = alerts.by_kind(store)
        except Exception as exc:
            log.warning("metrics: the database cannot be read: %s", str(exc).splitlines()[0][:200])
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up

        c = CounterMetricFamily("promptyoself_deliveries", "Delivery attempts recorded in history, by outcome.",
                                labels=["outcome"])
        for outcome in sorted({"delivered", "retry", "failed", "missed", "over_budget", *outcomes}):
            c.add_metric([outcome], outcomes.get(outcome, 0))
        yield c

        h = HistogramMetricFamily("promptyoself_delivery_lateness_seconds",
                                  "Lateness of delivered prompts (delivery time minus intended time).")
        h.add_metric([], [*[(str(b), n) for b, n in zip(LATENESS_BUCKETS, counts, strict=True)], ("+Inf", total)],
                     sum_value=late_sum)
        yield h

        g = GaugeMetricFamily("promptyoself_due_backlog", "Active schedules that are due and not yet delivered.")
        g.add_metric([], bl.due)
        yield g
        g = GaugeMetricFamily("promptyoself_schedules_active", "Active schedules.")
        g.add_metric([], bl.active)
        yield g
        g = GaugeMetricFamily("promptyoself_target_schedules_active",
                              "Active schedules by delivery target (every installed target, and any a schedule names).",
                              labels=["target"])
        d = GaugeMetricFamily("promptyoself_target_due_backlog", "Due, undelivered schedules by delivery target.",
                              labels=["target"])
        for target in sorted({*targets_registry.names(), *targets}):
            active, due = targets.get(target, (0, 0))
            g.add_metric([target], active)
            d.add_metric([target], due)
        yield g
        yield d
        g = GaugeMetricFamily("promptyoself_oldest_overdue_seconds",
                              "Age of the oldest due, undelivered occurrence (0 when none).")
        g.add_metric([], max((now - bl.oldest_overdue).total_seconds(), 0.0) if bl.oldest_overdue else 0.0)
        yield g

        c = CounterMetricFamily("promptyoself_claims_lost", "Attempts whose claim was lost before recording.")
        c.add_metric([], lost)
        yield c

        c = CounterMetricFamily("promptyoself_letta_errors", "Failed attempts by error kind (letta_unavailable, "
                                "letta_auth, agent_not_found, ...).", labels=["kind"])
        for kind, n in sorted(kinds.items()):
            c.add_metric([kind], n)
        yield c

        yield from self._guardrails(policy, pending, today)
        yield from self._spend(spend)

        c = CounterMetricFamily("promptyoself_alerts", "Alerts raised for the operator (a schedule paused by "
                                "delivery, an agent's first prompt held by a budget in a day, a target that "
                                "stopped answering), by kind.", labels=["kind"])
        for kind in sorted({"schedule_paused", "over_budget", "target_unready", *raised}):
            c.add_metric([kind], raised.get(kind, 0))
        yield c

        running = False
        delivery: Any = self.core.delivery
        ex = getattr(delivery, "executor", None)
        if ex is not None:
            running = bool(ex.running)
        g = GaugeMetricFamily("promptyoself_worker_up",
                              "1 when a live delivery runs for this database (worker lease or this service).")
        g.add_metric([], 1 if running or (lease is not None and lease["alive"]) else 0)
        yield g


    def _guardrails(self, policy: Policy, pending: int, today: dict[str, int]) -> Iterator[Metric]:
        """The guardrails as the stored policy holds them (``store/policy.py``: what every writer
        enforces, whatever this process's environment says; 0 = off) and what they hold back."""
        g = GaugeMetricFamily("promptyoself_guardrail_limit", "A guardrail's value in the operator's policy "
                              "(0 = no limit / off).", labels=["guardrail"])
        g.add_metric(["max_deliveries_per_agent_per_day"], policy.max_deliveries_per_agent_per_day)
        g.add_metric(["max_schedules_per_agent_per_hour"], policy.max_schedules_per_agent_per_hour)
        g.add_metric(["max_active_per_agent"], policy.max_active_per_agent)
        g.add_metric(["pause_after_failures"], policy.pause_after_failures)
        g.add_metric(["max_tokens_per_agent_per_day"], policy.max_tokens_per_agent_per_day)
        g.add_metric(["max_cost_usd_per_agent_per_day"], policy.max_cost_usd_per_agent_per_day)
        below = policy.approval_below
        g.add_metric(["approval_below_seconds"], below.total_seconds() if below is not None else 0)
        yield g
        g = GaugeMetricFamily("promptyoself_schedules_pending_approval",
                              "Schedules waiting for an operator's approval (the policy's approval_below).")
        g.add_metric([], pending)
        yield g
        g = GaugeMetricFamily("promptyoself_deliveries_today", "History rows since the budget day began "
                              "(PROMPTYOSELF_TIMEZONE), by outcome.", labels=["outcome"])
        for outcome in sorted({"delivered", "failed", "missed", "over_budget", *today}):
            g.add_metric([outcome], today.get(outcome, 0))
        yield g


    @staticmethod
    def _spend(spend: dict[str, tuple[int, float]]) -> Iterator[Metric]:
        """What each agent's receipts reported since the budget day began: the cost budgets' sums."""
        tokens = GaugeMetricFamily("promptyoself_tokens_today", "Input + output tokens the agent's delivered "
                                   "turns reported since the budget day began (PROMPTYOSELF_TIMEZONE), by agent.",
                                   labels=["agent_id"])
        cost = GaugeMetricFamily("promptyoself_cost_usd_today", "USD the agent's delivered turns reported since "
                                 "the budget day began (targets that report a cost), by agent.", labels=["agent_id"])
        for agent, (used, usd) in sorted(spend.items()):
            tokens.add_metric([agent], used)
            cost.add_metric([agent], round(usd, 6))
        yield tokens
        yield cost


def registry_for(core: Services) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DeliveryCollector(core))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
