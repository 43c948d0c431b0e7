"""A receipt from the real Claude Code (issue 43 point 1) through the shared harness
(tests/claude_code_harness.py: Claude Code 2.1.x against a mock Anthropic API, loopback only): a
session schedules a prompt with no ids; a real worker delivers it as ``claude -p --resume``; history
(``promptyoself history``) shows the resumed turn's receipt: the result's excerpt, ``num_turns``, the
usage's tokens, ``total_cost_usd`` and the permission denials. CPU heavy: one session, one delivery."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.claude_code_harness import ClaudeHarness
from tests.helpers_delivery import ROOT, child_env, get, make_core, wait_until
from tests.test_claude_code_real import cch, only_schedule, project, schedule_from_session, stop, worker

pytestmark = pytest.mark.slow
__all__ = ["cch", "project"]  # the fixtures, from the Claude Code tests


def test_a_resumed_turn_has_its_receipt_in_history(cch: ClaudeHarness, project: tuple) -> None:  # type: ignore[type-arg]
    proj, db = project
    schedule_from_session(cch, proj, "check the CI")
    row = only_schedule(db)
    w = worker(cch, db)
    core = make_core(db)
    try:
        wait_until(lambda: get(core.store, row["id"]).state == "completed", timeout=180)
    finally:
        stop(w)
        core.close()
    out = subprocess.run([sys.executable, "-m", "promptyoself", "--json", "history", "--schedule-id", str(row["id"])],
                         capture_output=True, text=True, env=child_env(db, None), cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    [entry] = json.loads(out.stdout)["deliveries"]
    receipt = entry["receipt"]
    assert entry["outcome"] == "delivered" and receipt["state"] == "complete", entry
    assert receipt["reply"] and len(receipt["reply"].encode()) <= 2048
    assert isinstance(receipt["steps"], int) and receipt["steps"] >= 1  # num_turns
    assert isinstance(receipt["input_tokens"], int) and isinstance(receipt["output_tokens"], int)
    assert isinstance(receipt["cost_usd"], float) and receipt["cost_usd"] >= 0  # total_cost_usd
    assert receipt["permission_denials"] == 0 and receipt["stop_reason"] == "success"
