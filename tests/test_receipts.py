"""Receipts (issue 43 point 1), the engine's logic in the fast tier: on the in-memory store with a
stand-in target and a fixed clock, through the same ``Engine``, recorder and receipt task as
production. A receipt is recorded with its delivered row, bounded; a target that gives none says so;
a pending one is completed afterwards by the receipt task (never by a sender) or times out, and the
occurrence stays delivered either way. The real entry points (the CLI, a worker, the fake Letta's
sync and async routes, a webhook receiver, Claude Code) are in ``tests/test_receipts_e2e.py``."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from promptyoself.config import Settings
from promptyoself.core.results import receipt_record, receipt_summary
from promptyoself.delivery import receipts
from promptyoself.delivery.bridge import Targets
from promptyoself.deps import Deps
from promptyoself.errors import NotSent, TargetUnavailable
from promptyoself.store.memory import MemoryDeliveryStore
from promptyoself.targets import registry
from promptyoself.targets.base import EXCERPT_BYTES, Fence, Occurrence, PendingReceipt, Receipt, Sent
from promptyoself.targets.claude_code import receipt as claude_receipt
from promptyoself.targets.letta import receipt as letta_receipt
from tests.engine_kit import T0, Clock, Recording, drain, memory_deps, registered


class ReceiptTarget(Recording):
    """Answers each send with ``give`` (a receipt, or None for none); ``later`` is what its
    ``receipt`` answers for a pending one (None: still pending); ``hang``: ``receipt`` never answers."""

    name = "receipts"

    def __init__(self) -> None:
        self.give: Receipt | None = Receipt(reply="done", steps=2, input_tokens=10, output_tokens=3)
        self.later: Receipt | None = None
        self.hang = False
        self.received: list[str] = []
        self.asked: list[PendingReceipt] = []
        self.down: set[str] = set()
        self._lock = threading.Lock()

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        if not fence():
            raise NotSent("fenced")
        if occ.agent_id in self.down:
            raise TargetUnavailable("down", transient=True, in_doubt=False)
        with self._lock:
            self.received.append(occ.occurrence_id)
        return Sent("test", f"run-{len(self.received)}", receipt=self.give)

    async def receipt(self, pending: PendingReceipt) -> Receipt:
        self.asked.append(pending)
        if self.hang:
            await asyncio.Event().wait()
        return self.later or pending.receipt


@pytest.fixture
def target() -> Iterator[ReceiptTarget]:
    with registered("receipts", ReceiptTarget()) as fake:
        yield fake


def rows(mem: MemoryDeliveryStore) -> list[dict[str, Any]]:
    return [dict(h) for h in mem.history]


def stored(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(row["receipt"])


def pass_once(deps: Deps) -> None:
    """One pass of the receipt task, as the executor's runs it."""
    async def one() -> None:
        targets = Targets(deps.settings)
        try:
            await receipts.follow_up(deps, targets)
        finally:
            await targets.aclose()

    asyncio.run(one())


def test_a_delivered_row_carries_what_the_target_reported(tmp_path: Path, target: ReceiptTarget) -> None:
    deps, mem = memory_deps(tmp_path, Clock())
    mem.add("agent-a", "p", T0, target="receipts")
    assert [r.outcome for r in drain(deps)] == ["delivered"]
    [row] = rows(mem)
    assert row["receipt_state"] == "complete"
    assert stored(row) == {"state": "complete", "reply": "done", "steps": 2, "input_tokens": 10, "output_tokens": 3}


def test_a_receipt_is_bounded_whatever_the_target_hands_back(tmp_path: Path, target: ReceiptTarget) -> None:
    deps, mem = memory_deps(tmp_path, Clock())
    target.give = Receipt(reply="é" * 5000, body="x" * 9000, tools=tuple(f"tool_{i}" for i in range(100)),
                          note="n" * 1000, cost_usd=float("nan"), steps=-3, ref={"a": "b" * 5000})
    mem.add("agent-a", "p", T0, target="receipts")
    drain(deps)
    [row] = rows(mem)
    got = stored(row)
    assert len(got["reply"].encode()) <= EXCERPT_BYTES and len(got["body"].encode()) <= EXCERPT_BYTES
    assert got["reply"] == "é" * (EXCERPT_BYTES // 2)  # never cut mid-character
    assert len(got["tools"]) == 20 and got["tool_calls"] == 100
    assert "cost_usd" not in got and got["steps"] == 0 and len(got["note"]) <= 300
    assert len(row["receipt"]) < 6000


def test_a_target_that_gives_no_receipt_says_so_and_other_rows_have_none(tmp_path: Path,
                                                                         target: ReceiptTarget) -> None:
    deps, mem = memory_deps(tmp_path, Clock())
    target.give = None
    mem.add("agent-a", "p", T0, target="receipts")
    target.down.add("agent-b")
    sid = mem.add("agent-b", "q", T0, target="receipts")
    drain(deps)
    by_schedule = {h["schedule_id"]: h for h in rows(mem)}
    delivered = by_schedule[1]
    assert delivered["outcome"] == "delivered" and delivered["receipt_state"] == "none"
    assert stored(delivered) == {"state": "none", "note": "the receipts target gives no receipt"}
    assert by_schedule[sid]["outcome"] == "retry" and by_schedule[sid]["receipt"] is None


def test_a_pending_receipt_is_completed_afterwards_and_the_occurrence_stays_delivered(
        tmp_path: Path, target: ReceiptTarget) -> None:
    clock = Clock()
    deps, mem = memory_deps(tmp_path, clock)
    target.give = Receipt(state="pending", note="waiting for run", ref={"kind": "run"})
    mem.add("agent-a", "p", T0, target="receipts")
    drain(deps)  # the drain's last pass asks once: still pending
    [row] = rows(mem)
    assert row["outcome"] == "delivered" and row["receipt_state"] == "pending"
    assert target.asked and target.asked[-1].run_id == "run-1" and target.asked[-1].receipt.ref == {"kind": "run"}
    target.later = Receipt(reply="finished", steps=1)
    pass_once(deps)
    [row] = rows(mem)
    assert row["outcome"] == "delivered" and row["receipt_state"] == "complete"
    assert stored(row) == {"state": "complete", "reply": "finished", "steps": 1}
    asked = len(target.asked)
    pass_once(deps)  # nothing pending any more: the target is not asked again
    assert len(target.asked) == asked


def test_a_receipt_that_never_comes_times_out_saying_so(tmp_path: Path, target: ReceiptTarget) -> None:
    clock = Clock()
    deps, mem = memory_deps(tmp_path, clock)
    target.give = Receipt(state="pending", note="waiting for Letta run run-1 to finish", ref={"kind": "run"})
    mem.add("agent-a", "p", T0, target="receipts")
    drain(deps)
    clock.now = T0 + receipts.WAIT - timedelta(seconds=1)
    pass_once(deps)
    assert rows(mem)[0]["receipt_state"] == "pending"
    clock.now = T0 + receipts.WAIT + timedelta(minutes=1)
    asked = len(target.asked)
    pass_once(deps)
    [row] = rows(mem)
    assert row["outcome"] == "delivered" and row["receipt_state"] == "timed_out"
    got = stored(row)
    assert got["state"] == "timed_out" and "ref" not in got
    assert got["note"].startswith("no receipt: the run had not finished 31m after the delivery")
    assert len(target.asked) == asked  # past the wait, the target is not asked


def test_a_receipt_that_hangs_holds_up_no_delivery(tmp_path: Path, target: ReceiptTarget,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The target's ``receipt`` never answers: both of the agent's occurrences are still delivered,
    one after the other, and the drain returns (its last pass is bounded)."""
    monkeypatch.setattr(receipts, "LAST_PASS", 0.3)
    monkeypatch.setattr(receipts, "EVERY", 0.01)
    deps, mem = memory_deps(tmp_path, Clock())
    target.give = Receipt(state="pending", ref={"kind": "run"})
    target.hang = True
    mem.add("agent-a", "first", T0 - timedelta(seconds=2), target="receipts")
    mem.add("agent-a", "second", T0 - timedelta(seconds=1), target="receipts")
    assert [r.outcome for r in drain(deps)] == ["delivered", "delivered"]
    assert [h["receipt_state"] for h in rows(mem)] == ["pending", "pending"]


def test_a_target_without_a_later_look_records_none(tmp_path: Path, target: ReceiptTarget) -> None:
    """A plug-in that answers ``pending`` but has no ``receipt`` method: recorded ``none``, saying so."""
    class NoLook(ReceiptTarget):
        receipt = None  # type: ignore[assignment]

    other = NoLook()
    other.give = Receipt(state="pending")
    registry.register("nolook", lambda _settings: other)
    try:
        deps, mem = memory_deps(tmp_path, Clock())
        mem.add("agent-a", "p", T0, target="nolook")
        drain(deps)
        got = stored(rows(mem)[0])
        assert got == {"state": "none", "note": "the receipts target cannot read a receipt after the delivery"}
    finally:
        registry.unregister("nolook")


def test_history_shows_every_field_and_one_line_of_it() -> None:
    raw = Receipt(reply="Checked the queue.", tools=("memory_insert", "web_search"), steps=3, input_tokens=1200,
                  output_tokens=40, cached_tokens=800, cost_usd=0.0123, permission_denials=1).to_json()
    record = receipt_record(raw)
    assert record is not None and set(record) == {
        "state", "reply", "tools", "tool_calls", "steps", "input_tokens", "output_tokens", "cached_tokens",
        "reasoning_tokens", "cost_usd", "permission_denials", "stop_reason", "http_status", "body", "note"}
    assert record["tool_calls"] == 2 and record["reasoning_tokens"] is None
    assert receipt_summary(record) == ("complete; reply: Checked the queue.; tools: memory_insert, web_search; "
                                       "3 steps; tokens 1200 in / 40 out (800 cached); $0.0123; "
                                       "1 permission denials")
    assert receipt_record(None) is None and receipt_record("not json") is None and receipt_summary(None) == "-"


# ---- Letta's answers as receipts ---------------------------------------------------------------


SYNC_ANSWER = {  # the shape of Letta 0.16.8's LettaResponse (/work/shared/letta/API.md)
    "messages": [
        {"id": "message-1", "message_type": "reasoning_message", "reasoning": "...", "step_id": "step-1"},
        {"id": "message-2", "message_type": "tool_call_message", "step_id": "step-1",
         "tool_call": {"name": "memory_insert", "arguments": "{}", "tool_call_id": "c1"}},
        {"id": "message-3", "message_type": "tool_return_message", "step_id": "step-1", "tool_return": "ok"},
        {"id": "message-4", "message_type": "assistant_message", "step_id": "step-2",
         "content": [{"type": "text", "text": "Noted "}, {"type": "text", "text": "it."}]},
    ],
    "stop_reason": {"message_type": "stop_reason", "stop_reason": "end_turn"},
    "usage": {"message_type": "usage_statistics", "completion_tokens": 30, "prompt_tokens": 900,
              "total_tokens": 930, "step_count": 2, "cached_input_tokens": 512, "reasoning_tokens": None},
}


def test_letta_sync_answer_and_finished_run_as_receipts() -> None:
    got = letta_receipt.of_sync_answer(SYNC_ANSWER)
    assert got == Receipt(reply="Noted it.", tools=("memory_insert",), tool_calls=1, steps=2, input_tokens=900,
                          output_tokens=30, cached_tokens=512, stop_reason="end_turn")
    waiting = letta_receipt.pending("run-1")
    assert waiting.state == "pending" and waiting.ref == {"kind": "run"}
    assert letta_receipt.of_run(waiting, {"run": {"status": "running"}}) is waiting
    usage = {"completion_tokens": 30, "prompt_tokens": 900, "total_tokens": 930,  # /usage: no step count
             "prompt_tokens_details": None, "completion_tokens_details": {"reasoning_tokens": 7}}
    done = letta_receipt.of_run(waiting, {"run": {"status": "failed", "stop_reason": "llm_api_error"},
                                          "messages": SYNC_ANSWER["messages"], "usage": usage})
    assert done.state == "complete" and done.steps == 2 and done.reasoning_tokens == 7  # steps: distinct step ids
    assert done.stop_reason == "llm_api_error" and done.note == "the run ended failed"
    assert letta_receipt.pending(None).state == "none"


# ---- Claude Code's answers as receipts ---------------------------------------------------------


def test_claude_code_resumed_turn_result_as_a_receipt() -> None:
    result = {  # the shape of `claude -p --output-format json`'s result (2.1.x)
        "type": "result", "subtype": "success", "is_error": False, "duration_ms": 2100, "num_turns": 3,
        "result": "I checked the CI: green.", "session_id": "s-1", "total_cost_usd": 0.0421,
        "usage": {"input_tokens": 12, "cache_creation_input_tokens": 3000, "cache_read_input_tokens": 9000,
                  "output_tokens": 250},
        "permission_denials": [{"tool_name": "Bash", "tool_use_id": "t1", "tool_input": {}}]}
    got = claude_receipt.of_result(result)
    assert got == Receipt(reply="I checked the CI: green.", steps=3, input_tokens=12_012, output_tokens=250,
                          cached_tokens=9000, cost_usd=0.0421, permission_denials=1, stop_reason="success")
    assert claude_receipt.of_result({"result": 5, "usage": "x"}) == Receipt()


def _line(kind: str, content: Any, **message: Any) -> str:
    return json.dumps({"type": kind, "message": {"role": kind, "content": content, **message}})


def test_claude_code_live_turn_from_the_transcript_after_the_marker() -> None:
    needle = "[PromptYoSelf occurrence promptyoself-1-1000]"
    waiting = claude_receipt.pending_turn("s-1", "promptyoself-1-1000")
    before = [_line("user", "an earlier prompt"),
              _line("assistant", [{"type": "text", "text": "earlier answer"}], id="m0", stop_reason="end_turn",
                    usage={"input_tokens": 99, "output_tokens": 99})]
    prompt = [_line("user", [{"type": "text", "text": f"<channel>check the CI\n\n{needle}</channel>"}])]
    tool_turn = [
        _line("assistant", [{"type": "text", "text": "Looking."}], id="m1", stop_reason=None,
              usage={"input_tokens": 10, "cache_read_input_tokens": 100, "output_tokens": 5}),
        _line("assistant", [{"type": "tool_use", "name": "Bash", "id": "t1", "input": {}}], id="m1",
              stop_reason="tool_use", usage={"input_tokens": 10, "cache_read_input_tokens": 100, "output_tokens": 5}),
        _line("user", [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]),
    ]
    answer = [_line("assistant", [{"type": "text", "text": "CI is green."}], id="m2", stop_reason="end_turn",
                    usage={"input_tokens": 20, "cache_read_input_tokens": 200, "output_tokens": 7})]
    assert claude_receipt.of_transcript(before, needle, waiting) is waiting  # no marker yet
    assert claude_receipt.of_transcript(before + prompt + tool_turn, needle, waiting) is waiting  # mid-turn
    done = claude_receipt.of_transcript(before + prompt + tool_turn + answer + before, needle, waiting)
    assert done == Receipt(reply="CI is green.", tools=("Bash",), tool_calls=1, steps=2, input_tokens=330,
                           output_tokens=12, cached_tokens=300, stop_reason="end_turn")


def test_a_pending_receipt_whose_target_no_longer_loads_waits_then_times_out(tmp_path: Path,
                                                                             target: ReceiptTarget) -> None:
    clock = Clock()
    deps, mem = memory_deps(tmp_path, clock)
    target.give = Receipt(state="pending", ref={"kind": "run"})
    mem.add("agent-a", "p", T0, target="receipts")
    drain(deps)
    registry.unregister("receipts")
    try:
        pass_once(deps)  # the target cannot be opened: left pending, no error
        assert rows(mem)[0]["receipt_state"] == "pending"
        clock.now = T0 + receipts.WAIT + timedelta(seconds=1)
        pass_once(deps)
        assert rows(mem)[0]["receipt_state"] == "timed_out"
    finally:
        registry.register("receipts", lambda _settings: target)


def test_no_secret_reaches_a_receipt(tmp_path: Path, target: ReceiptTarget) -> None:
    """What the agent or a receiver answered may repeat a credential: history holds none (as for errors)."""
    key = "sk-let-0123456789abcdef-SECRET"
    clock = Clock()
    mem = MemoryDeliveryStore()
    settings = Settings(db=str(tmp_path / "unused.db"), executor_autostart=False, letta_timeout=2.0,
                        lease_seconds=30.0, executor_interval=0.05, letta_api_key=key)  # type: ignore[arg-type]
    deps = Deps(settings, deliveries=mem, clock=clock)
    target.give = Receipt(reply=f"my key is {key}", body=f"Authorization: Bearer {key}")
    mem.add("agent-a", "p", T0, target="receipts")
    target_later = Receipt(state="pending")
    mem.add("agent-b", "q", T0, target="receipts")
    drain(deps)
    assert all(key not in (h["receipt"] or "") for h in rows(mem))
    assert "my key is" in (rows(mem)[0]["receipt"] or "")
    target.later = Receipt(reply=f"later: {key}")
    for h in mem.history:  # a pending one completed later is redacted too
        h.update(receipt_state="pending", receipt=target_later.to_json())
    pass_once(deps)
    assert all(h["receipt_state"] == "complete" and key not in h["receipt"] for h in rows(mem))


def test_a_stored_receipt_leaves_out_what_was_not_reported_and_reads_back_the_same() -> None:
    """The stored form: bounded, fields a target did not report left out, ``ref`` kept for a pending
    one; read back and stored again it is the same text; a receipt is bounded once however often asked."""
    pending = Receipt(state="pending", ref={"run": "run-1", "kind": "run"})
    assert pending.to_json() == '{"state":"pending","ref":{"run":"run-1","kind":"run"}}'
    big = Receipt(reply="é" * 3000, tools=tuple(f"t{i}" for i in range(30)), tool_calls=3, input_tokens=-5,
                  cost_usd=0.1234567891, ref={"k" * 50: 1, "list": [1], "s": "x" * 600})
    stored = json.loads(big.to_json())
    assert stored["tool_calls"] == 30 and len(stored["tools"]) == 20 and stored["input_tokens"] == 0
    assert stored["cost_usd"] == 0.123457 and len(stored["reply"].encode()) <= EXCERPT_BYTES
    assert stored["ref"] == {"k" * 40: 1, "s": "x" * 512}
    back = Receipt.from_json(big.to_json())
    assert back is not None and back.to_json() == big.to_json()
    assert big.bounded() is big.bounded() and big.bounded().bounded() is big.bounded()
    assert big.redacted(lambda text: text) is big
    # a value of another type is made what its field holds, though equal (3.0 == 3, True == 1); a text goes
    # through UTF-8 (a lone surrogate cannot be stored)
    reported: dict[str, Any] = {"input_tokens": 3.0, "steps": True, "reply": "\ud800 lone", "ref": {"n": 1}}
    odd = Receipt(**reported)  # what a target might hand back, whatever the annotations say
    assert odd.bounded() is not odd and odd.bounded().input_tokens == 3 and type(odd.bounded().input_tokens) is int
    assert odd.bounded().steps is None and odd.bounded().reply == "? lone"


def test_a_pending_receipt_is_followed_up_by_the_process_that_sent_it(tmp_path: Path,
                                                                      target: ReceiptTarget) -> None:
    """Every delivering process asked every pending receipt on every pass (four workers: four times the
    reads at the target). The pending receipt names the process that sent it; the others leave it to that
    one until ``ORPHAN_AFTER``, then any of them asks (the sender is gone, or stalls). The target never
    sees that name."""
    clock = Clock()
    deps, mem = memory_deps(tmp_path, clock)
    target.give = Receipt(state="pending", ref={"kind": "run"})
    mem.add("agent-a", "p", T0, target="receipts")
    drain(deps)
    [row] = rows(mem)
    sender = stored(row)["ref"][receipts.FOLLOWED_BY]
    assert sender.count(":") == 3 and target.asked[-1].receipt.ref == {"kind": "run"}  # role:host:pid:random

    async def one_pass(owner: str | None) -> None:
        targets = Targets(deps.settings)
        try:
            await receipts.follow_up(deps, targets, owner=owner)
        finally:
            await targets.aclose()

    asked = len(target.asked)
    asyncio.run(one_pass("worker:another:1:x"))  # another process: left to the sender
    assert len(target.asked) == asked
    asyncio.run(one_pass(sender))  # the sender asks
    assert len(target.asked) == asked + 1
    clock.now = T0 + receipts.ORPHAN_AFTER + timedelta(seconds=1)
    target.later = Receipt(reply="finished")
    asyncio.run(one_pass("worker:another:1:x"))  # past ORPHAN_AFTER: anyone asks, and records it
    assert len(target.asked) == asked + 2 and rows(mem)[0]["receipt_state"] == "complete"


def test_receipts_wait_while_deliveries_are_backlogged_and_not_longer_than_backlog_wait(
        tmp_path: Path, target: ReceiptTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    """During a backlog (more due than the senders carry) the receipt pass leaves the send slots, the
    target and the database to the deliveries; once it is over the pass asks; and a backlog that lasts
    gets its receipts read every ``BACKLOG_WAIT`` all the same (``receipts.yields``, pure)."""
    deps, mem = memory_deps(tmp_path, Clock())
    target.give = Receipt(state="pending", ref={"kind": "run"})
    mem.add("agent-a", "p", T0, target="receipts")
    drain(deps)  # its last pass asks once
    asked = len(target.asked)
    target.later = Receipt(reply="finished")
    monkeypatch.setattr(receipts, "EVERY", 0.001)
    owner = json.loads(rows(mem)[0]["receipt"])["ref"][receipts.FOLLOWED_BY]
    looks: list[bool] = []
    backlog = True

    def backlogged() -> bool:
        looks.append(backlog)
        return backlog

    async def run() -> None:
        nonlocal backlog
        targets = Targets(deps.settings)
        task = asyncio.create_task(receipts.run_receipts(deps, targets, owner, backlogged))
        try:
            while len(looks) < 20:
                await asyncio.sleep(0.001)
            assert len(target.asked) == asked and rows(mem)[0]["receipt_state"] == "pending"
            backlog = False
            while rows(mem)[0]["receipt_state"] == "pending":
                await asyncio.sleep(0.001)
        finally:
            task.cancel()
            await targets.aclose()

    asyncio.run(asyncio.wait_for(run(), 30))
    assert len(target.asked) == asked + 1 and stored(rows(mem)[0])["reply"] == "finished"
    assert receipts.yields(True, 0.0) and receipts.yields(True, receipts.BACKLOG_WAIT - 0.001)
    assert not receipts.yields(True, receipts.BACKLOG_WAIT) and not receipts.yields(False, 0.0)


def pending_rows(tmp_path: Path, target: ReceiptTarget, n: int) -> tuple[Deps, MemoryDeliveryStore, str]:
    """``n`` delivered rows whose receipts are pending, and the process that follows them up."""
    deps, mem = memory_deps(tmp_path, Clock())
    target.give = Receipt(state="pending", ref={"kind": "run"})
    for i in range(n):
        mem.add(f"agent-{i}", "p", T0, target="receipts")
    drain(deps)
    assert [h["receipt_state"] for h in mem.history] == ["pending"] * n
    return deps, mem, stored(rows(mem)[0])["ref"][receipts.FOLLOWED_BY]


def test_a_pass_asks_a_few_receipts_at_once_and_records_each(tmp_path: Path, target: ReceiptTarget,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst's receipts were asked one at a time (a Letta run: three GETs each). A pass now asks
    ``ASK_AT_ONCE`` at a time, never more (the target's spare connections), and records every answer."""
    deps, mem, owner = pending_rows(tmp_path, target, 7)
    now = at_most = 0
    release = asyncio.Event()

    async def receipt(pending: PendingReceipt) -> Receipt:
        nonlocal now, at_most
        now += 1
        at_most = max(at_most, now)
        await release.wait()
        now -= 1
        return Receipt(reply=f"finished {pending.delivery_id}")

    monkeypatch.setattr(target, "receipt", receipt)

    async def run() -> tuple[int, int]:
        targets = Targets(deps.settings)
        try:
            task = asyncio.create_task(receipts.follow_up(deps, targets, owner=owner))
            while now < receipts.ASK_AT_ONCE:
                await asyncio.sleep(0)
            for _ in range(20):  # the others wait for a free place, however long this one takes
                await asyncio.sleep(0)
            assert now == receipts.ASK_AT_ONCE
            release.set()
            return await task
        finally:
            await targets.aclose()

    assert asyncio.run(asyncio.wait_for(run(), 30)) == (0, 7)  # not a full pass: the next starts again
    assert at_most == receipts.ASK_AT_ONCE == 2
    assert [stored(h)["reply"] for h in rows(mem)] == [f"finished {h['id']}" for h in rows(mem)]


def test_the_next_pass_goes_on_at_once_while_receipts_come_and_waits_when_none_came(
        tmp_path: Path, target: ReceiptTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a full pass that recorded receipts the next pass starts at once (a burst's thousands are
    read one pass after another, not one pass per ``EVERY``); after one that recorded none (the runs
    go on, or the target is away) the task waits ``EVERY`` before it asks again."""
    deps, mem, owner = pending_rows(tmp_path, target, 5)
    monkeypatch.setattr(receipts, "BATCH", 2)
    monkeypatch.setattr(receipts, "EVERY", 3600.0)  # a pass waited for would never come in this test
    asked = len(target.asked)

    async def run(until: Any) -> None:
        targets = Targets(deps.settings)
        task = asyncio.create_task(receipts.run_receipts(deps, targets, owner))
        try:
            while not until():
                await asyncio.sleep(0)
            for _ in range(50):
                await asyncio.sleep(0)
        finally:
            task.cancel()
            await targets.aclose()

    asyncio.run(asyncio.wait_for(run(lambda: len(target.asked) >= asked + receipts.BATCH), 30))
    assert len(target.asked) == asked + receipts.BATCH  # still pending: no pass after the first
    target.later = Receipt(reply="finished")
    asyncio.run(asyncio.wait_for(run(lambda: all(h["receipt_state"] == "complete" for h in mem.history)), 30))
    assert [h["receipt_state"] for h in mem.history] == ["complete"] * 5  # three passes, one after another


def test_a_pending_receipt_with_a_full_ref_keeps_the_targets_entries_and_its_follower(
        tmp_path: Path, target: ReceiptTarget) -> None:
    """A target's ``ref`` keeps its first ``REF_ENTRIES`` entries; the process that follows the receipt up
    is one more, never pushed out by them (before, a target's eighth entry dropped it, and every
    delivering process asked that receipt on every pass)."""
    from promptyoself.targets.base import REF_ENTRIES

    deps, mem = memory_deps(tmp_path, Clock())
    full = {f"k{i}": i for i in range(REF_ENTRIES + 3)}
    target.give = Receipt(state="pending", ref=full)
    mem.add("agent-a", "p", T0, target="receipts")
    drain(deps)
    ref = stored(rows(mem)[0])["ref"]
    assert list(ref) == [f"k{i}" for i in range(REF_ENTRIES)] + [receipts.FOLLOWED_BY]
    assert target.asked[-1].receipt.ref == {f"k{i}": i for i in range(REF_ENTRIES)}  # the target sees its own
