"""A cost budget holds a Claude Code agent after its reported cost passes the limit (issue 43 point 2),
from an empty database through the real entry points: the CLI sets the operator's policy, a real
Claude Code session (tests/claude_code_harness.py: the real CLI against a mock Anthropic API) schedules
a recurring prompt with no ids, a real worker delivers the first occurrence as a resumed turn whose
result reports ``total_cost_usd`` (the receipt's ``cost_usd``), and the next occurrence is recorded
``over_budget`` with the reason, not sent; ``promptyoself health`` lists the agent as held by cost.

CPU heavy: one session and one delivered turn."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.claude_code_harness import ClaudeHarness, latest
from tests.helpers_delivery import ROOT, child_env, wait_until
from tests.test_claude_code_real import call_from_session, cch, only_schedule, project, stop, worker

pytestmark = pytest.mark.slow
__all__ = ["cch", "project"]  # the fixtures, from the Claude Code tests

EVERY = "mcp__promptyoself__promptyoself_schedule_every"
LIMIT = "0.000001"
"""USD a day: less than any turn the real CLI prices (the mock's 10 input and 5 output tokens)."""


def cli_json(db: Path, *argv: str, ok: bool = True) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "promptyoself", "--json", *argv], capture_output=True, text=True,
                         env=child_env(db, None), cwd=ROOT, timeout=60)
    assert out.returncode == 0 or not ok, out.stdout + out.stderr
    return dict(json.loads(out.stdout))


def schedule_every_from_session(cch: ClaudeHarness, proj: Path, prompt: str, every: str) -> str:
    """A session in ``proj`` whose agent calls promptyoself_schedule_every with no ids; its id."""
    return call_from_session(cch, proj, EVERY, {"prompt": prompt, "every": every})


@latest
def test_a_cost_budget_holds_a_claude_code_agent_after_its_reported_cost(cch: ClaudeHarness,
                                                                          project: tuple[Path, Path]) -> None:
    proj, db = project
    policy = cli_json(db, "policy", "set", f"max_cost_usd_per_agent_per_day={LIMIT}")
    assert policy["policy"]["max_cost_usd_per_agent_per_day"] == float(LIMIT)
    session = schedule_every_from_session(cch, proj, "check the CI", "10s")  # the shortest allowed
    row = only_schedule(db)
    agent = row["agent_id"]
    assert row["target"] == "claude-code" and agent == f"claude-code-{session}"

    def history() -> list[dict[str, Any]]:
        rows = cli_json(db, "history", "--schedule-id", str(row["id"]))["deliveries"]  # newest first
        # oldest first; a slot coalesced into a later one (a slow start) is recorded missed: not of interest
        return [d for d in reversed(rows) if d["outcome"] != "missed"]

    w = worker(cch, db)
    try:
        got = wait_until(lambda: (h := history()) and [d["outcome"] for d in h][:2] == ["delivered", "over_budget"]
                         and h, timeout=240, interval=2)
    finally:
        stop(w)
    delivered, held = got[0], got[1]
    receipt = delivered["receipt"]
    assert receipt["state"] == "complete" and isinstance(receipt["cost_usd"], float)
    assert receipt["cost_usd"] > float(LIMIT)  # the real CLI's total_cost_usd passed the budget
    assert held["error"].startswith(f"over_budget: agent {agent} spent $")
    assert f"(the operator's policy max_cost_usd_per_agent_per_day={LIMIT}); not sent." in held["error"]
    assert held["error"].endswith("The budget resets at midnight UTC.")
    assert held["receipt"] is None
    assert all(d["outcome"] == "over_budget" for d in got[1:])  # held for the rest of the day

    health = cli_json(db, "health", ok=False)  # degraded once the worker is stopped: nothing delivers
    [cost] = health["guardrails"]["held_by_cost"]
    assert cost["agent_id"] == agent and cost["cost_usd_today"] == round(receipt["cost_usd"], 6)
    assert cost["reason"].startswith(f"over_budget: agent {agent} spent $")
    listed = cli_json(db, "list", "--agent-id", agent)["guardrails"]["usage"]
    assert listed["cost_budget_usd"] == float(LIMIT) and listed["cost_left_usd"] == 0.0
