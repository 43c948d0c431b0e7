"""Receipts end to end (issue 43 point 1), from an empty database through the real entry points: the
CLI (``promptyoself schedule``, ``execute``, ``history``) and a worker process (``promptyoself worker
--shared``) deliver to the fake Letta's sync and async routes and to a real webhook receiver; each
delivered row's receipt is read back through ``promptyoself history`` (JSON, and the terminal's one
line). The engine's logic is in ``tests/test_receipts.py`` (fast tier); the real Claude Code in
``tests/test_receipts_claude.py``."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.fake_letta import FakeLetta
from testkit.webhook_receiver import WebhookReceiver
from tests.helpers_delivery import CLI, ROOT, Proc, cli_env, cli_json, kill_all, wait_until
from tests.test_cli_terminal import on_tty

pytestmark = pytest.mark.slow

SECRET = "whsec_" + base64.b64encode(b"the-secret-of-the-receipt-tests!").decode()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "receipts.db"
    yield path
    kill_all(path)


def env_for(db: Path, **extra: str) -> dict[str, str]:
    return cli_env(db, COLUMNS="200", **extra)


def due_prompt(env: dict[str, str], agent: str, *extra: str) -> int:
    """A one-time prompt made through the CLI, due a second later (then waited for)."""
    made = cli_json(env, "schedule", "--skip-validation", "--prompt", "Check the queue", "--time", "in 1s",
               "--agent-id", agent, *extra)
    time.sleep(1.2)
    return int(made["id"])


def receipts_of(env: dict[str, str], sid: int) -> list[dict[str, Any] | None]:
    rows = cli_json(env, "history", "--schedule-id", str(sid))["deliveries"]
    return [r["receipt"] for r in rows if r["outcome"] == "delivered"]


def test_letta_sync_route_receipt_through_execute_and_history(db: Path) -> None:
    with FakeLetta(agents=1, async_route=False) as fake:  # a server without the async route: sync
        fake.configure(reply_text="Queue checked: 3 items.", turn_tools=["memory_insert", "conversation_search"])
        env = env_for(db, LETTA_BASE_URL=fake.url)
        sid = due_prompt(env, fake.agent_ids[0])
        assert cli_json(env, "execute")["executed"][0]["outcome"] == "delivered"
        [receipt] = receipts_of(env, sid)
    usage = FakeLetta.turn_usage(3)
    assert receipt == {
        "state": "complete", "reply": "Queue checked: 3 items.", "tools": ["memory_insert", "conversation_search"],
        "tool_calls": 2, "steps": 3, "input_tokens": usage["prompt_tokens"],
        "output_tokens": usage["completion_tokens"], "cached_tokens": None, "reasoning_tokens": None,
        "cost_usd": None, "permission_denials": None, "stop_reason": "end_turn", "http_status": None, "body": None,
        "note": None}
    code, shown = on_tty([*CLI, "history", "--schedule-id", str(sid)], env)  # a terminal: the table
    assert code == 0 and "complete; reply: Queue checked: 3 items.; tools: memory_insert, conversation_search" in \
        " ".join(shown.split()), shown


def test_letta_async_route_receipt_is_read_from_the_finished_run(db: Path) -> None:
    """``execute`` sends through the async route (the run finishes after the send answered) and its
    last pass reads the run's messages and usage: the row is delivered with a complete receipt."""
    with FakeLetta(agents=1) as fake:
        fake.configure(reply_text="Done.", turn_tools=["memory_insert"])
        env = env_for(db, LETTA_BASE_URL=fake.url)
        sid = due_prompt(env, fake.agent_ids[0])
        [item] = cli_json(env, "execute")["executed"]
        [receipt] = receipts_of(env, sid)
    assert item["outcome"] == "delivered" and item["letta_run_id"].startswith("run-")
    assert receipt is not None and receipt["state"] == "complete"
    assert (receipt["reply"], receipt["tools"], receipt["steps"]) == ("Done.", ["memory_insert"], 2)
    usage = FakeLetta.turn_usage(2)
    assert (receipt["input_tokens"], receipt["output_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])


def test_a_worker_completes_a_pending_receipt_once_the_run_finishes_without_holding_a_delivery(db: Path) -> None:
    """The run is still running when the worker has delivered: the row is delivered with a pending
    receipt, and the agent's next prompt is delivered meanwhile; once the run finishes, the worker's
    receipt task records the turn."""
    with FakeLetta(agents=1) as fake:
        fake.configure(reply_text="Finally done.", run_status="running")
        env = env_for(db, LETTA_BASE_URL=fake.url)
        agent = fake.agent_ids[0]
        first = due_prompt(env, agent)
        w = Proc([*CLI, "worker", "--shared"], {**env, "PROMPTYOSELF_EXECUTOR_INTERVAL": "0.2"})
        try:
            wait_until(lambda: receipts_of(env, first) != [], timeout=60)
            [pending] = receipts_of(env, first)
            assert pending is not None and pending["state"] == "pending"
            assert pending["note"].startswith("waiting for Letta run run-")
            second = due_prompt(env, agent)  # the same agent: delivered while the first receipt waits
            wait_until(lambda: receipts_of(env, second) != [], timeout=60)
            assert receipts_of(env, first)[0]["state"] == "pending"  # type: ignore[index]
            fake.configure(run_status="completed")
            wait_until(lambda: all(r and r["state"] == "complete" for r in
                                   receipts_of(env, first) + receipts_of(env, second)), timeout=60)
        finally:
            w.popen.send_signal(signal.SIGTERM)
            w.popen.wait(timeout=30)
        [done] = receipts_of(env, first)
    assert done is not None and done["reply"] == "Finally done." and done["stop_reason"] == "end_turn"
    assert done["steps"] == 1 and done["note"] is None


def test_webhook_receipt_has_the_status_and_a_bounded_excerpt_of_the_body(db: Path) -> None:
    with WebhookReceiver(SECRET) as rx:
        rx.answer_body = ("ok " + "é" * 20_000).encode()  # about 40 KB: only an excerpt is kept
        env = env_for(db, PROMPTYOSELF_WEBHOOK_URL=rx.url, PROMPTYOSELF_WEBHOOK_SECRET=SECRET)
        sid = due_prompt(env, "deploy-bot", "--target", "webhook")
        assert cli_json(env, "execute")["executed"][0]["outcome"] == "delivered"
        [receipt] = receipts_of(env, sid)
    assert receipt is not None and receipt["state"] == "complete" and receipt["http_status"] == 200
    body = receipt["body"]
    assert body.startswith("ok éé") and len(body.encode()) <= 2048 and "\ufffd" not in body
    assert receipt["reply"] is None and receipt["input_tokens"] is None


def test_history_rows_from_before_receipts_and_other_outcomes_have_none(db: Path) -> None:
    """A failed attempt (Letta unreachable) is a row with ``receipt: null``."""
    env = env_for(db)
    sid = due_prompt(env, "agent-1")
    subprocess.run([*CLI, "execute"], capture_output=True, env=env, cwd=ROOT, timeout=120)
    rows = cli_json(env, "history", "--schedule-id", str(sid))["deliveries"]
    assert rows and all(r["outcome"] != "delivered" and r["receipt"] is None for r in rows)
    assert os.path.exists(db)


def test_letta_code_receipt_from_the_turns_stream(db: Path, tmp_path: Path) -> None:
    """Letta Code's App Server streams the turn (its answer, its usage) on the socket the send holds."""
    from testkit.fake_letta_code import FakeLettaCode

    with FakeLettaCode(tmp_path / "lc", agents=1, turn=0.1) as lc:
        env = env_for(db, LETTA_CODE_URL=lc.url)
        sid = due_prompt(env, lc.agent_ids[0], "--target", "letta-code")
        assert cli_json(env, "execute")["executed"][0]["outcome"] == "delivered"
        [receipt] = receipts_of(env, sid)
    assert receipt is not None and receipt["state"] == "complete"
    assert (receipt["reply"], receipt["steps"], receipt["input_tokens"], receipt["output_tokens"]) == (
        "fake reply", 1, 700, 2)
    assert receipt["stop_reason"] == "end_turn" and receipt["cost_usd"] is None
