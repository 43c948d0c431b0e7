"""The receipt of a turn on the Letta REST API (issue 43 point 1), from what Letta 0.16 answers: the
sync route's answer (``messages``, ``stop_reason``, ``usage`` with ``step_count``), or, for the async
route, the run once it has finished (``GET /v1/runs/{id}``, ``/messages``, ``/usage``). The reply is
the last assistant message's text; the tools are the tool calls' names in order; the steps are the
usage's ``step_count`` or else the distinct ``step_id`` of the turn's messages. Letta reports tokens,
not money: ``cost_usd`` stays None."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from promptyoself.targets.base import Receipt

RUN = "run"
"""``Receipt.ref["kind"]`` of a receipt waiting for a Letta run."""


def _text(content: object) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [str(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "".join(parts) if parts else None
    return None


def _tool_names(message: Mapping[str, Any]) -> list[str]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        one = message.get("tool_call")
        calls = [one] if isinstance(one, dict) else []
    return [str(c.get("name")) for c in calls if isinstance(c, dict) and c.get("name")]


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def of_turn(messages: object, usage: object, stop_reason: object, *, status: str | None = None) -> Receipt:
    """A receipt from a turn's messages, its usage and its stop reason (any of them missing)."""
    reply: str | None = None
    tools: list[str] = []
    steps: set[str] = set()
    for m in messages if isinstance(messages, list) else ():
        if not isinstance(m, dict):
            continue
        kind = m.get("message_type")
        if kind == "user_message":
            continue
        if isinstance(m.get("step_id"), str):
            steps.add(m["step_id"])
        if kind == "assistant_message":
            reply = _text(m.get("content")) or reply
        elif kind == "tool_call_message":
            tools.extend(_tool_names(m))
    u = usage if isinstance(usage, dict) else {}
    if isinstance(stop_reason, dict):
        stop_reason = stop_reason.get("stop_reason")
    found_in, found_out = u.get("prompt_tokens_details"), u.get("completion_tokens_details")
    details_in: dict[str, Any] = found_in if isinstance(found_in, dict) else {}
    details_out: dict[str, Any] = found_out if isinstance(found_out, dict) else {}
    cached = _int(u.get("cached_input_tokens"))
    if cached is None:
        cached = _int(details_in.get("cached_tokens")) or _int(details_in.get("cache_read_tokens"))
    reasoning = _int(u.get("reasoning_tokens"))
    if reasoning is None:
        reasoning = _int(details_out.get("reasoning_tokens"))
    note = None if status in (None, "completed") else f"the run ended {status}"
    return Receipt(
        reply=reply, tools=tuple(tools), tool_calls=len(tools), steps=_int(u.get("step_count")) or (len(steps) or None),
        input_tokens=_int(u.get("prompt_tokens")), output_tokens=_int(u.get("completion_tokens")),
        cached_tokens=cached, reasoning_tokens=reasoning,
        stop_reason=stop_reason if isinstance(stop_reason, str) else None, note=note,
    ).bounded()


def of_sync_answer(answer: object) -> Receipt:
    """The sync route's answer (``LettaResponse``)."""
    if not isinstance(answer, dict):
        return Receipt.none("Letta's answer to the message had no body to read")
    return of_turn(answer.get("messages"), answer.get("usage"), answer.get("stop_reason"))


def pending(run_id: str | None) -> Receipt:
    """The async route: the run finishes later; its receipt is read then (``of_run``)."""
    if not run_id:
        return Receipt.none("Letta's answer named no run to read the turn from")
    return Receipt(state="pending", note=f"waiting for Letta run {run_id} to finish", ref={"kind": RUN})


def of_run(pending_receipt: Receipt, got: Mapping[str, Any]) -> Receipt:
    """What ``AsyncLettaClient.run_turn`` answered: still pending while the run has not finished."""
    run = got.get("run") or {}
    if "messages" not in got:
        return pending_receipt
    status = run.get("status") if isinstance(run, dict) else None
    return of_turn(got.get("messages"), got.get("usage"), run.get("stop_reason") if isinstance(run, dict) else None,
                   status=status if isinstance(status, str) else None)
