"""Capacity (issue 42 finding 15): 10,000 every-minute schedules over 200 agents went out at 100-180 a
second with the worker at 19 % CPU, 52 s late on average, and 9,720 runs coalesced (``missed``). The
bound was the send slots: 8 per target, at a target answering in 50 ms, is 160 a second, below the
arrival rate (167). One message at a time per agent was not (50 prompts per agent per minute leave
1.2 s for each of its sends). The default is 32 slots per target (``claude-code`` keeps at most 8), and
the Letta client keeps a connection per slot, whatever names them.

The last test runs the capacity bench with ``--quick`` (240 schedules every 15 s over 48 agents, a
fake Letta answering in 1 s: 16 a second arrive, 8 slots would carry 8; measured over the first two
slots): every schedule's first run is delivered exactly once and nothing is recorded ``missed``. It
asserts states, never durations."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from promptyoself.config import Settings
from promptyoself.delivery.holdings import Holdings
from promptyoself.delivery.watch import AuthBackoff, Gate, LoopState
from tests.conftest import make_settings


def _holdings(settings: Settings) -> Holdings:
    return Holdings(settings.max_in_flight, 60.0, Gate(LoopState(), AuthBackoff(), None), settings.target_in_flight)


def test_the_default_slots_carry_ten_thousand_every_minute_at_fifty_ms(db_path: Path) -> None:
    settings = make_settings(db_path)
    lanes = _holdings(settings)
    per_second = lanes.senders_of("letta") / 0.05  # sends a second at a target answering in 50 ms
    assert per_second >= 10_000 / 60 * 2, per_second  # twice the arrival rate: a minute's burst clears in half
    assert lanes.senders_of("webhook") == lanes.senders_of("letta") == settings.max_in_flight == 32


def test_claude_code_keeps_at_most_eight_slots_unless_named(db_path: Path) -> None:
    assert _holdings(make_settings(db_path)).senders_of("claude-code") == 8
    assert _holdings(make_settings(db_path, max_in_flight=3)).senders_of("claude-code") == 3
    named = make_settings(db_path, target_slots="claude-code=12,letta=64")
    assert _holdings(named).senders_of("claude-code") == 12 and _holdings(named).senders_of("letta") == 64


def test_the_letta_client_keeps_a_connection_for_each_of_its_slots(db_path: Path) -> None:
    """PROMPTYOSELF_TARGET_IN_FLIGHT=letta=64 with the default MAX_IN_FLIGHT once left the client with
    34 connections: the other 30 senders waited for one."""
    from promptyoself.targets.letta.target import LettaRestTarget

    target = LettaRestTarget(make_settings(db_path, target_slots="letta=64"))
    try:
        assert target.client._connections == 66  # one per slot, plus a look-up and a probe
    finally:
        asyncio.run(target.aclose())


@pytest.mark.slow
def test_the_quick_capacity_run_delivers_every_first_run_once_and_misses_none() -> None:
    from bench import capacity

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pg-url", default=None)
    capacity.add_arguments(parser)
    rows = capacity.run(parser.parse_args(["--quick"]))
    result = rows[0].extra
    assert result["duplicates"] == 0, result
    assert result["first_slot_delivered"] == result["schedules"] == 240, result
    assert result["missed"] == 0 and result["other"] == 0, result
    assert all(r.command.endswith("-m bench --only capacity --quick") for r in rows)


@pytest.mark.postgres
def test_the_claims_candidate_query_is_planned_for_its_values_on_postgresql() -> None:
    """On PostgreSQL the store's connections plan prepared statements generically (store.db); with every
    row due at one instant, 50 per agent, the candidates' generic plan took 5 s a claim (12 deliveries a
    second in bench capacity). The claim's transaction plans it for its values (``plan_cache_mode =
    auto``, for that transaction only)."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import text

    from promptyoself.store import claims
    from promptyoself.store.db import Store
    from tests.pg import pg_schema, require_pg

    require_pg()
    now = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)
    with pg_schema() as url:
        store = Store(url)
        try:
            with store.engine.begin() as conn:
                claims.claim_due_in(conn, "A", now, now + timedelta(seconds=30), limit=4)
                assert conn.execute(text("SHOW plan_cache_mode")).scalar_one() == "auto"
            with store.engine.begin() as conn:  # the connection's own setting is back after the commit
                assert conn.execute(text("SHOW plan_cache_mode")).scalar_one() == "force_generic_plan"
        finally:
            store.close()
