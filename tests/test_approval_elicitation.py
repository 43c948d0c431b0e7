"""Approval asked in the caller's own MCP client (issue 43 point 5), through FastMCP's in-memory
``Client(server, elicitation_handler=...)``: approve and deny are recorded with the schedule; a client
without elicitation, no answer in time, or a dismissed question leave it ``pending_approval``; an
agent-token caller is never asked. The handshake-era protocol (what Claude Desktop and Letta speak):
the 2026-07-28 era has no channel for a server's request during a call, and such a client is not
asked (also tested)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult

from promptyoself.core import agent_tokens
from promptyoself.core.operations import Core
from promptyoself.faces.mcp import build_server
from promptyoself.faces.mcp_approval import DENIED
from tests.helpers_delivery import make_core

AGENT = "agent-approval-1"
T0 = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)
ARGS = {"prompt": "check the queue", "every": "10m", "agent_id": AGENT, "skip_validation": True}


def core_for(db_path: Path, **overrides: Any) -> Core:
    return make_core(db_path, clock=lambda: T0, approval_below="1h", **overrides)


def call(core: Core, handler: Any, *, mode: str = "legacy") -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        kwargs: dict[str, Any] = {"mode": mode}
        if handler is not None:
            kwargs["elicitation_handler"] = handler
        async with Client(build_server(core), **kwargs) as client:
            got = await client.call_tool("promptyoself_schedule_every", ARGS)
            assert isinstance(got.structured_content, dict)
            return got.structured_content

    return asyncio.run(run())


class Asked:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.messages: list[str] = []

    async def __call__(self, message: str, response_type: Any, params: Any, context: Any) -> Any:
        self.messages.append(message)
        if isinstance(self.answer, float):
            await asyncio.sleep(self.answer)
            return {"value": "approve"}
        return self.answer


def state_of(core: Core, sid: int) -> tuple[str, str | None]:
    listed = asyncio.run(core.scheduling.list_schedules(agent_id=AGENT, include_cancelled=True))["schedules"]
    [row] = [s for s in listed if s["id"] == sid]
    return row["state"], row["last_error"]


def test_approved_in_the_client_the_schedule_is_active(db_path: Path) -> None:
    core = core_for(db_path)
    asked = Asked({"value": "approve"})
    try:
        made = call(core, asked)
        assert made["state"] == "active" and "approved in your client" in made["message"]
        assert state_of(core, made["id"]) == ("active", None)
        [question] = asked.messages
        assert f"Agent {AGENT}" in question and "check the queue" in question
        assert "Rule: Every 10m (UTC)." in question and "Next runs: " in question and "2026-06-15" in question
    finally:
        core.close()


def test_denied_in_the_client_the_schedule_is_cancelled_with_the_reason(db_path: Path) -> None:
    core = core_for(db_path)
    try:
        made = call(core, Asked("deny"))
        assert made["state"] == "cancelled" and "denied in your client" in made["message"]
        assert state_of(core, made["id"]) == ("cancelled", DENIED)
    finally:
        core.close()


@pytest.mark.parametrize("answer", [ElicitResult(action="decline"), ElicitResult(action="cancel")])
def test_a_dismissed_question_leaves_it_pending(db_path: Path, answer: Any) -> None:
    core = core_for(db_path)
    try:
        made = call(core, Asked(answer))
        assert made["state"] == "pending_approval"
        assert state_of(core, made["id"])[0] == "pending_approval"
    finally:
        core.close()


def test_a_client_without_elicitation_leaves_it_pending(db_path: Path) -> None:
    core = core_for(db_path)
    try:
        made = call(core, None)
        assert made["state"] == "pending_approval" and state_of(core, made["id"])[0] == "pending_approval"
    finally:
        core.close()


def test_a_client_on_the_newest_protocol_is_not_asked(db_path: Path) -> None:
    core = core_for(db_path)
    asked = Asked({"value": "approve"})
    try:
        made = call(core, asked, mode="auto")
        assert made["state"] == "pending_approval" and asked.messages == []
    finally:
        core.close()


@pytest.mark.slow
def test_no_answer_in_time_leaves_it_pending(db_path: Path) -> None:
    core = core_for(db_path, approval_ask_timeout=0.3)
    asked = Asked(5.0)  # answers after 5 s: too late
    try:
        made = call(core, asked)
        assert made["state"] == "pending_approval" and len(asked.messages) == 1
        assert state_of(core, made["id"])[0] == "pending_approval"
    finally:
        core.close()


def test_zero_timeout_never_asks(db_path: Path) -> None:
    core = core_for(db_path, approval_ask_timeout=0)
    asked = Asked({"value": "approve"})
    try:
        assert call(core, asked)["state"] == "pending_approval" and asked.messages == []
    finally:
        core.close()


def test_an_agent_token_caller_is_never_asked(db_path: Path) -> None:
    op_core = core_for(db_path)
    token = asyncio.run(agent_tokens.mint(op_core, AGENT))["token"]
    op_core.close()
    core = core_for(db_path, agent_token=token)
    asked = Asked({"value": "approve"})
    try:
        made = call(core, asked)
        assert made["state"] == "pending_approval" and asked.messages == []
        assert state_of(core, made["id"])[0] == "pending_approval"
    finally:
        core.close()


def test_an_answer_to_a_schedule_that_needs_none_is_never_asked(db_path: Path) -> None:
    core = make_core(db_path, clock=lambda: T0)  # approval_below off
    asked = Asked({"value": "deny"})
    try:
        made = call(core, asked)
        assert made["state"] == "active" and asked.messages == []
    finally:
        core.close()
