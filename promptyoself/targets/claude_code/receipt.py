"""A Claude Code turn's receipt (issue 43 point 1).

- A resumed turn (``claude -p --resume <id> --output-format json``): its result object. ``reply`` is
  its ``result`` (excerpt), ``steps`` its ``num_turns``, ``cost_usd`` its ``total_cost_usd``,
  ``permission_denials`` how many it lists, ``stop_reason`` its ``subtype``; the tokens from its
  ``usage``: ``input_tokens`` counts every input token (``input_tokens`` plus the cache's reads and
  writes), ``cached_tokens`` the cache's reads. The result names no tools: ``tools`` stays empty.
- A live Channels push: the turn that followed the prompt's marker in the session's transcript, read
  after the delivery (``of_transcript``): the last assistant text, the ``tool_use`` names, the assistant
  messages as steps and the sum of their usage. Transcripts carry no cost. Until that turn has
  ended (an assistant message that did not stop for a tool, or the next prompt) it is pending."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from promptyoself.targets.base import Receipt

TRANSCRIPT = "transcript"
"""``Receipt.ref["kind"]`` of a receipt waiting for a turn in a session's transcript."""


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _sum(*values: object) -> int | None:
    found = [v for v in (_int(x) for x in values) if v is not None]
    return sum(found) if found else None


def of_result(result: Mapping[str, Any]) -> Receipt:
    """The receipt of a resumed turn, from ``claude -p --output-format json``'s result object."""
    usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
    assert isinstance(usage, dict)
    denials = result.get("permission_denials")
    cost = result.get("total_cost_usd")
    return Receipt(
        reply=result.get("result") if isinstance(result.get("result"), str) else None,
        steps=_int(result.get("num_turns")),
        input_tokens=_sum(usage.get("input_tokens"), usage.get("cache_creation_input_tokens"),
                          usage.get("cache_read_input_tokens")),
        output_tokens=_int(usage.get("output_tokens")), cached_tokens=_int(usage.get("cache_read_input_tokens")),
        cost_usd=float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None,
        permission_denials=len(denials) if isinstance(denials, list) else None,
        stop_reason=result.get("subtype") if isinstance(result.get("subtype"), str) else None,
    ).bounded()


def pending_turn(session_id: str, occurrence_id: str) -> Receipt:
    """A live push: the turn is read from the transcript afterwards."""
    return Receipt(state="pending", note=f"waiting for the turn after the prompt in Claude Code session {session_id}",
                   ref={"kind": TRANSCRIPT, "session": session_id, "occurrence": occurrence_id})


def _prompt_texts(entry: Mapping[str, Any]) -> list[str] | None:
    """A user line's texts (a prompt), or None for a line that only returns tool results."""
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        texts = [b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]
        return texts if texts or not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content) \
            else None
    return []


def of_transcript(lines: Iterable[str], needle: str, pending: Receipt) -> Receipt:
    """The turn after the user line carrying ``needle`` (the prompt's marker), from the transcript's
    JSON lines: complete once it has ended, else ``pending`` as given."""
    started = ended = False
    reply: str | None = None
    tools: list[str] = []
    usage: dict[str, dict[str, Any]] = {}  # per assistant message id (a message spans several lines)
    stop: str | None = None
    for line in lines:
        if not started and needle not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        kind = entry.get("type")
        if not started:
            texts = _prompt_texts(entry) if kind == "user" else []
            started = bool(texts) and any(needle in t for t in texts or [])
            continue
        if kind == "user":
            if _prompt_texts(entry) is not None:  # the next prompt: the turn is over
                ended = True
                break
            continue
        if kind != "assistant" or not isinstance(entry.get("message"), dict):
            continue
        message = entry["message"]
        for block in message.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
                reply = block["text"]
            elif isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name"):
                tools.append(str(block["name"]))
        if isinstance(message.get("usage"), dict):
            usage[str(message.get("id") or len(usage))] = message["usage"]
        stop = message.get("stop_reason") if isinstance(message.get("stop_reason"), str) else None
    if not started or not (ended or (stop is not None and stop != "tool_use")):
        return pending
    def total(*keys: str) -> int | None:
        return _sum(*(u.get(k) for u in usage.values() for k in keys))

    return Receipt(reply=reply, tools=tuple(tools), tool_calls=len(tools), steps=len(usage) or None,
                   input_tokens=total("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"),
                   output_tokens=total("output_tokens"), cached_tokens=total("cache_read_input_tokens"),
                   stop_reason=stop).bounded()
