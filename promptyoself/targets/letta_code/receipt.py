"""A Letta Code turn's receipt (issue 43 point 1), from the App Server's ``stream_delta`` frames of the
message's run, read while the send holds its socket for the turn: the assistant messages (chunks of
one message share its ``id``; the reply is the last message's text), the tool calls' names, and the
``usage_statistics`` delta (``prompt_tokens``, ``completion_tokens``, ``step_count``, cached and
reasoning tokens where reported). A turn whose frames carry none of these gives a receipt that says so."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from promptyoself.targets.base import Receipt


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def of_deltas(deltas: Iterable[Mapping[str, Any]]) -> Receipt:
    texts: dict[str, str] = {}  # message id -> its text so far, in the order the messages came
    tools: list[str] = []
    usage: Mapping[str, Any] | None = None
    stop: str | None = None
    for d in deltas:
        kind = d.get("message_type")
        if kind == "assistant_message":
            key = str(d.get("id") or len(texts))
            texts[key] = texts.get(key, "") + _text(d.get("content"))
        elif kind == "tool_call_message":
            found = d.get("tool_calls")
            calls: list[Any] = found if isinstance(found, list) else [d.get("tool_call")]
            tools.extend(str(c["name"]) for c in calls if isinstance(c, dict) and c.get("name"))
        elif kind == "usage_statistics":
            usage = d
        elif kind == "stop_reason" and isinstance(d.get("stop_reason"), str):
            stop = d["stop_reason"]
    if not texts and usage is None and not tools:
        return Receipt(stop_reason=stop, note="Letta Code reported no messages or usage for the turn").bounded()
    u = usage or {}
    return Receipt(
        reply=list(texts.values())[-1] if texts else None, tools=tuple(tools), tool_calls=len(tools),
        steps=_int(u.get("step_count")), input_tokens=_int(u.get("prompt_tokens")),
        output_tokens=_int(u.get("completion_tokens")), cached_tokens=_int(u.get("cached_input_tokens")),
        reasoning_tokens=_int(u.get("reasoning_tokens")), stop_reason=stop,
    ).bounded()
