"""Receipts from the real Claude Code (issue 43 point 1) through the shared harness
(tests/claude_code_harness.py: Claude Code 2.1.x against a mock Anthropic API, loopback only).

- Resumed: a session schedules a prompt with no ids; a real worker delivers it as ``claude -p
  --resume``; history (``promptyoself history``) shows the resumed turn's receipt: the result's
  excerpt, ``num_turns``, the usage's tokens, ``total_cost_usd`` and the permission denials.
- Live: an open session with our channel gets the prompt pushed; the row is delivered with a pending
  receipt, which the worker's receipt task completes from the turn after the marker in the transcript.

CPU heavy: one session and one delivery each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.claude_code_harness import ClaudeHarness
from tests.helpers_delivery import ROOT, child_env, get, make_core, wait_until
from tests.test_claude_code_channels import plugin_project, schedule_in, session_args
from tests.test_claude_code_real import cch, only_schedule, project, schedule_from_session, stop, worker

pytestmark = pytest.mark.slow
__all__ = ["cch", "plugin_project", "project"]  # the fixtures, from the Claude Code tests


def test_a_resumed_turn_has_its_receipt_in_history(cch: ClaudeHarness, project: tuple[Path, Path]) -> None:
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


def history_json(db: Path, sid: int) -> list[dict[str, Any]]:
    out = subprocess.run([sys.executable, "-m", "promptyoself", "--json", "history", "--schedule-id", str(sid)],
                         capture_output=True, text=True, env=child_env(db, None), cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout)["deliveries"])


def test_a_live_push_has_the_turn_after_its_marker_as_its_receipt(cch: ClaudeHarness,
                                                                   plugin_project: tuple[Path, Path]) -> None:
    proj, db = plugin_project
    with cch.h.stream_session(cwd=str(proj), args=session_args()) as s:
        schedule_in(s, "check the CI")
        row = only_schedule(db)
        w = worker(cch, db)
        try:
            result = s.next_result(timeout=180)  # the open session's own turn for the pushed prompt
            wait_until(lambda: [d["receipt"]["state"] for d in history_json(db, row["id"])
                                if d["outcome"] == "delivered"] == ["complete"], timeout=120, interval=1)
        finally:
            stop(w)
    [entry] = history_json(db, row["id"])
    receipt = entry["receipt"]
    answer = str(result.get("result"))
    assert answer.startswith("MOCK_ACK <channel ")  # the session's answer to the pushed prompt ...
    assert receipt["reply"] and answer.startswith(receipt["reply"][:40])  # ... is the receipt's reply
    assert isinstance(receipt["steps"], int) and receipt["steps"] >= 1
    assert isinstance(receipt["output_tokens"], int) and receipt["cost_usd"] is None  # transcripts carry no cost
