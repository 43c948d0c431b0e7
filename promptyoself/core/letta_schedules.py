"""Letta's scheduling API (``/v1/agents/{agent_id}/schedule``), as the ``letta-client`` SDK 1.12.x speaks it.

Letta's hosted API has these routes; self-hosted Letta 0.16.8 does not. A schedule made here is an
ordinary PromptYoSelf schedule (one-time: ``once``; recurring: ``cron`` in UTC) whose request
payload (``messages``, ``callback_url``, ``include_return_message_types``, ``max_steps``) is kept in
``letta_payload`` and sent as is to Letta's async message route at delivery. Claims, retries and
history are therefore the same as for every other schedule, and the MCP tools and CLI list, cancel
and show history of these schedules too (their ids are the same numbers, as strings here).

Shapes (the SDK's types are the contract):
- create ``{"schedule": {"type": "one-time", "scheduled_at": <unix ms>} | {"type": "recurring",
  "cron_expression": "<5 fields, UTC>"}, "messages": [...], ...}`` -> ``{"id", "next_scheduled_at"}``
- list ``?after=<id>&limit=<n>`` -> ``{"has_next_page", "scheduled_messages": [ScheduledMessage]}``
- retrieve -> ``ScheduledMessage`` ``{"id", "agent_id", "message", "next_scheduled_time", "schedule"}``
- delete -> ``{"success": true}``
Errors: ``InvalidArgument`` (400: a past ``scheduled_at``, a bad body), ``BadNumber`` (422: NaN or
Infinity anywhere in the body, a boolean or a fraction where an integer is meant), ``NotFound`` (404).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from promptyoself import timing
from promptyoself.core.checks import check_finite, check_limit, check_unicode, json_leaves, parse_schedule_id
from promptyoself.core.results import (
    LettaScheduleCreated,
    LettaScheduleDeleted,
    LettaScheduledMessage,
    LettaSchedulePage,
)
from promptyoself.errors import BadNumber, Forbidden, InvalidArgument, InvalidCron, NotFound, PromptTooLong
from promptyoself.store import LIVE_STATES

if TYPE_CHECKING:
    from promptyoself.core.operations import Core
    from promptyoself.store.records import ScheduleRow

ROLES = ("user", "assistant", "system")
RETURN_TYPES = (
    "system_message",
    "user_message",
    "assistant_message",
    "reasoning_message",
    "hidden_reasoning_message",
    "tool_call_message",
    "tool_return_message",
    "approval_request_message",
    "approval_response_message",
)
URL_FIELDS = ("callback_url",)
"""Fields of the create body that make Letta fetch a URL (with our credentials, from Letta's network):
refused from an agent token (issue 42 item 11). Images are base64 only (``_part``), never a URL."""
DEFAULT_LIMIT = 50
MAX_LIMIT = 100
MAX_STEPS = 10_000
"""The largest ``max_steps`` accepted (Letta's default is 50 steps per message)."""


def _part(part: object, where: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise InvalidArgument(f"{where} must be an object (a text or image content part).")
    kind = part.get("type", "text")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise InvalidArgument(f"{where}.text must be a string.")
        sig = part.get("signature")
        if sig is not None and not isinstance(sig, str):
            raise InvalidArgument(f"{where}.signature must be a string or null.")
        return dict(part)
    if kind == "image":
        src = part.get("source")
        if not isinstance(src, dict) or not isinstance(src.get("data"), str) or not isinstance(
            src.get("media_type"), str
        ):
            raise InvalidArgument(f"{where}.source must be an object with string 'data' and 'media_type'.")
        if src.get("type", "base64") != "base64":
            raise InvalidArgument(f"{where}.source.type must be 'base64'.")
        return dict(part)
    raise InvalidArgument(f"{where}.type must be 'text' or 'image'.")


def _message(msg: object, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise InvalidArgument(f"{where} must be an object with 'role' and 'content'.")
    if msg.get("role") not in ROLES:
        raise InvalidArgument(f"{where}.role must be one of {', '.join(ROLES)}.")
    content = msg.get("content")
    if isinstance(content, str):
        pass
    elif isinstance(content, list) and content:
        content = [_part(p, f"{where}.content[{j}]") for j, p in enumerate(content)]
    else:
        raise InvalidArgument(f"{where}.content must be a string or a non-empty list of content parts.")
    out: dict[str, Any] = {"role": msg["role"], "content": content}
    if msg.get("otid") is not None:
        raise InvalidArgument(
            f"{where}.otid is set by PromptYoSelf: each delivery carries its own (promptyoself-<schedule>-<slot>), "
            "by which a send whose answer was lost is found in Letta rather than sent twice. Leave it out."
        )
    for key in ("name", "sender_id"):
        if msg.get(key) is not None:
            if not isinstance(msg[key], str):
                raise InvalidArgument(f"{where}.{key} must be a string.")
            out[key] = msg[key]
    if msg.get("type") is not None:
        if msg["type"] != "message":
            raise InvalidArgument(f"{where}.type must be 'message'.")
        out["type"] = "message"
    return out


def check_payload(body: dict[str, Any]) -> dict[str, Any]:
    """The payload passed on to Letta at delivery, validated (400 on anything Letta would refuse; 422
    for NaN, Infinity or a boolean where a number is meant, anywhere in the body)."""
    check_finite(body, "body")  # anywhere: a stored NaN breaks every read of its row and every send
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("messages must be a non-empty list of messages.")
    payload: dict[str, Any] = {"messages": [_message(m, i) for i, m in enumerate(messages)]}
    url = body.get("callback_url")
    if url is not None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidArgument("callback_url must be an http(s) URL.")
        payload["callback_url"] = url
    types = body.get("include_return_message_types")
    if types is not None:
        if not isinstance(types, list) or any(t not in RETURN_TYPES for t in types):
            raise InvalidArgument(f"include_return_message_types must be a list of: {', '.join(RETURN_TYPES)}.")
        payload["include_return_message_types"] = list(types)
    steps = body.get("max_steps")
    if steps is not None:
        if isinstance(steps, float) and steps.is_integer():
            steps = int(steps)  # 5.0: JavaScript clients send whole numbers so
        payload["max_steps"] = check_limit("max_steps", steps, 1, MAX_STEPS)
    return payload


def _check_strings(value: object, where: str) -> None:
    """No NUL and no lone surrogate anywhere in the payload: neither can be stored (PostgreSQL text
    refuses NUL, UTF-8 refuses surrogates) nor sent, so they are a 400 now, not a failure later."""
    for leaf, at in json_leaves(value, where):
        if isinstance(leaf, str):
            if "\x00" in leaf:
                raise InvalidArgument(f"{at} must not contain NUL characters.")
            check_unicode(at, leaf)


def payload_chars(payload: dict[str, Any]) -> int:
    """The characters of text the payload stores: every string in it but image data (whose size the
    request-size limit bounds) and the fixed words (role, type, media type)."""
    def count(value: object, key: str = "") -> int:
        if isinstance(value, str):
            return 0 if key in ("data", "role", "type", "media_type") else len(value)
        if isinstance(value, dict):
            return sum(count(v, k) for k, v in value.items())
        if isinstance(value, list):
            return sum(count(v) for v in value)
        return 0

    return count(payload)


def summary_text(payload: dict[str, Any], limit: int) -> str:
    """A readable prompt text for list/history (the payload itself is what Letta receives)."""
    lines: list[str] = []
    for m in payload["messages"]:
        c = m["content"]
        if isinstance(c, str):
            lines.append(c)
        else:
            lines.extend(p["text"] if p.get("type", "text") == "text" else "[image]" for p in c)
    text = "\n".join(lines).strip() or "[scheduled message]"
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def _ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


class LettaSchedules:
    """The four scheduling-API operations over a ``Core`` (its store, clock and schedule machinery)."""

    def __init__(self, core: Core) -> None:
        self.core = core

    # ---- create -------------------------------------------------------------------------------

    async def create(self, agent_id: str, body: object, *, by_agent: bool = False) -> LettaScheduleCreated:
        """``by_agent``: the caller holds an agent token, not the operator's: it may not name a URL that
        Letta would fetch with this service's credentials (``URL_FIELDS``: 403 ``forbidden``)."""
        from promptyoself.core.options import ScheduleOptions
        from promptyoself.core.scheduling import Plan

        if not isinstance(body, dict):
            raise InvalidArgument("The body must be a JSON object with 'schedule' and 'messages'.")
        if by_agent:
            named = [key for key in URL_FIELDS if body.get(key) is not None]
            if named:
                raise Forbidden(f"{', '.join(named)} is the operator's: Letta fetches that URL with this "
                                "service's credentials, so an agent token may not set it. Leave it out, or "
                                "schedule with the operator token (PROMPTYOSELF_HTTP_TOKEN).")
        sched = body.get("schedule")
        if not isinstance(sched, dict):
            raise InvalidArgument("schedule must be an object: {'type': 'one-time', 'scheduled_at': <unix ms>} "
                                  "or {'type': 'recurring', 'cron_expression': '0 9 * * *'}.")
        payload = check_payload(body)
        core = self.core
        _check_strings(payload, "body")
        size = payload_chars(payload)
        if size > core.settings.max_prompt_chars:
            raise PromptTooLong(
                f"The messages hold {size} characters of text; the limit is {core.settings.max_prompt_chars} "
                "(PROMPTYOSELF_MAX_PROMPT_CHARS). Shorten them."
            )
        now = core.now()
        kind = sched.get("type", "one-time")
        utc = ZoneInfo("UTC")
        if kind == "one-time":
            at = sched.get("scheduled_at")
            if isinstance(at, bool):
                raise BadNumber("schedule.scheduled_at must be a number (unix milliseconds), got a boolean.")
            if not isinstance(at, (int, float)):
                raise InvalidArgument("schedule.scheduled_at must be a number (unix milliseconds).")
            try:
                when = datetime.fromtimestamp(at / 1000, tz=UTC)
            except (OverflowError, OSError, ValueError):
                raise InvalidArgument("schedule.scheduled_at is out of range (unix milliseconds).") from None
            if when <= now:
                raise InvalidArgument(
                    f"schedule.scheduled_at ({at}) is not in the future (now is {_ms(now)} unix ms)."
                )
            plan = Plan("once", when.isoformat(), utc, when, "Scheduled a one-time Letta message.")
        elif kind == "recurring":
            expr = sched.get("cron_expression")
            if not isinstance(expr, str) or len(expr.split()) != 5:
                raise InvalidCron("schedule.cron_expression must be a 5-field cron rule in UTC, e.g. '0 9 * * *'.")
            expr = timing.normalize_cron(expr)
            first = timing.next_cron(expr, utc, now)
            plan = Plan("cron", expr, utc, first, f"Scheduled a recurring Letta message '{expr}' (UTC).")
        else:
            raise InvalidArgument("schedule.type must be 'one-time' or 'recurring'.")
        text = summary_text(payload, core.settings.max_prompt_chars)
        stored = json.dumps(payload, separators=(",", ":"), allow_nan=False)
        size = len(stored.encode("utf-8", "surrogatepass"))
        if size > core.settings.max_payload_bytes:  # image data too: every byte that is stored counts
            raise PromptTooLong(
                f"The scheduled message is {size} bytes as stored (images included); the limit is "
                f"{core.settings.max_payload_bytes} (PROMPTYOSELF_MAX_PAYLOAD_BYTES). Send smaller images or less text."
            )
        plan = Plan(plan.schedule_type, plan.value, plan.tz, plan.next_run, plan.message, letta_payload=stored)
        created = await core.scheduling._create(text, plan, ScheduleOptions(agent_id=agent_id), now)
        return {"id": str(created["id"]), "next_scheduled_at": created["next_run"]}

    # ---- read ---------------------------------------------------------------------------------

    async def list(self, agent_id: str, *, after: object = None, limit: object = None) -> LettaSchedulePage:
        lim = DEFAULT_LIMIT
        if limit is not None and limit != "":
            try:
                lim = int(str(limit))
            except ValueError:
                raise InvalidArgument("limit must be an integer.") from None
            if not 1 <= lim <= MAX_LIMIT:
                raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}.")
        start = self._id(after, found=False) if after is not None and after != "" else None
        rows = await self.core.deliveries.letta_page(agent_id, start, lim + 1)
        out = [self._record(r) for r in rows[:lim]]
        return {"has_next_page": len(rows) > lim, "scheduled_messages": out}

    async def retrieve(self, agent_id: str, scheduled_message_id: object) -> LettaScheduledMessage:
        return self._record(await self._live(agent_id, scheduled_message_id))

    async def delete(self, agent_id: str, scheduled_message_id: object) -> LettaScheduleDeleted:
        sid = (await self._live(agent_id, scheduled_message_id)).id
        await self.core.scheduling.cancel(sid)
        return {"success": True}

    # ---- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _id(value: object, *, found: bool = True) -> int:
        try:
            return parse_schedule_id(value)
        except InvalidArgument:
            if found:
                raise NotFound(f"No scheduled message with id {value!r}.") from None
            raise InvalidArgument(f"after must be a scheduled message id, got {value!r}.") from None

    async def _live(self, agent_id: str, scheduled_message_id: object) -> ScheduleRow:
        sid = self._id(scheduled_message_id)
        row = await self.core.deliveries.schedule(sid)
        if row is None or row.agent_id != agent_id or row.letta_payload is None or row.state not in LIVE_STATES:
            raise NotFound(f"No scheduled message {scheduled_message_id} for agent {agent_id}.")
        return row

    @staticmethod
    def _record(row: ScheduleRow) -> LettaScheduledMessage:
        assert row.letta_payload is not None  # _live and letta_page keep only the API's schedules
        payload = json.loads(row.letta_payload)
        message: dict[str, Any] = {
            "messages": payload["messages"],
            "callback_url": payload.get("callback_url"),
            "include_return_message_types": payload.get("include_return_message_types"),
            "max_steps": payload.get("max_steps"),
        }
        if row.schedule_type == "once":
            schedule: dict[str, Any] = {
                "type": "one-time",
                "scheduled_at": _ms(datetime.fromisoformat(row.schedule_value)),
            }
        else:
            schedule = {"type": "recurring", "cron_expression": row.schedule_value}
        return {
            "id": str(row.id),
            "agent_id": row.agent_id,
            "message": message,
            "next_scheduled_time": row.next_run.isoformat() if row.next_run else None,
            "schedule": schedule,
        }
