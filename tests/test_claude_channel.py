"""Live delivery into Claude Code (issue 31 point 3), fast tier: the pieces that decide without a
process or a socket. When a session counts as idle (its transcript), when its ``claude`` runs our
channel (its command line), what the stdio server's listener answers and writes to Claude Code, and
what ``claude-code install`` prints. The real thing runs in tests/test_claude_code_channels.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from promptyoself.targets.claude_code import install as claude_plugin
from promptyoself.targets.claude_code import session as claude_code
from promptyoself.targets.claude_code.channel import channel_named, judge, meta_for, readiness, transcript_idle
from promptyoself.targets.claude_code.channel_server import METHOD, ChannelListener
from tests.conftest import make_settings

SESSION = "4f7c1f0e-1111-4222-8333-944455556666"


def _assistant(stop: str | None) -> dict[str, Any]:
    return {"type": "assistant", "message": {"role": "assistant", "stop_reason": stop}}


USER = {"type": "user", "message": {"role": "user", "content": "hi"}}
ENQ = {"type": "queue-operation", "operation": "enqueue", "content": "next"}
DEQ = {"type": "queue-operation", "operation": "dequeue"}


@pytest.mark.parametrize(("entries", "idle"), [
    ([], True),
    ([ENQ, DEQ, USER, _assistant("end_turn"), {"type": "last-prompt"}], True),
    ([USER], False),  # the model is asked
    ([USER, _assistant("tool_use")], False),  # a tool runs
    ([USER, _assistant("tool_use"), {"type": "user", "message": {"content": [{"type": "tool_result"}]}}], False),
    ([USER, _assistant("end_turn"), ENQ], False),  # a prompt is queued
    ([USER, _assistant(None)], False),  # still streaming
])
def test_a_session_is_idle_when_its_last_turn_ended(entries: list[dict[str, Any]], idle: bool) -> None:
    assert transcript_idle(entries) is idle


@pytest.mark.parametrize(("argv", "on"), [
    (["node", "claude", "--channels", "plugin:promptyoself@promptyoself-local"], True),
    (["claude", "--channels", "plugin:other@m", "plugin:promptyoself@x", "--verbose"], True),
    (["claude", "--channels=plugin:promptyoself@x"], True),
    (["claude", "--dangerously-load-development-channels", "plugin:promptyoself@x"], True),
    (["claude", "--channels", "plugin:other@m", "--verbose", "plugin:promptyoself@x"], False),
    (["claude", "-p", "--resume", "x"], False),
])
def test_channels_on_reads_the_claude_command_line(argv: list[str], on: bool) -> None:
    assert channel_named(argv) is on


class _Stream:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, message: Any) -> None:
        self.sent.append(message)


def _listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ChannelListener, _Stream]:
    home = tmp_path / "claude"
    (home / "sessions").mkdir(parents=True)
    (home / "sessions" / "4242.json").write_text(json.dumps({"pid": 4242, "sessionId": SESSION, "cwd": "/w"}))
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(home))
    stream = _Stream()
    return ChannelListener(stream, 4242), stream


def test_the_listener_pushes_a_channel_notification_into_its_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listener, stream = _listener(tmp_path, monkeypatch)
    meta = meta_for(7, "promptyoself-7-1000", "2026-01-01T00:00:00+00:00")
    request = {"op": "push", "session_id": SESSION, "content": "check the CI", "meta": meta}
    answer = anyio.run(listener.answer, json.dumps(request).encode())
    assert answer == {"ok": True, "session_id": SESSION}
    [message] = stream.sent
    wire = json.loads(message.message.model_dump_json(by_alias=True, exclude_unset=True))
    assert wire == {"jsonrpc": "2.0", "method": METHOD, "params": {"content": "check the CI", "meta": meta}}
    assert METHOD == "notifications/claude/channel"


@pytest.mark.parametrize(("request_", "why"), [
    ({"op": "push", "session_id": "another-session", "content": "x", "meta": {}}, "holds session"),
    ({"op": "push", "session_id": SESSION, "content": "", "meta": {}}, "content"),
    ({"op": "push", "session_id": SESSION, "content": "x", "meta": {"a": 1}}, "meta"),
    ({"op": "drop"}, "unknown op"),
    ([1], "object"),
])
def test_the_listener_refuses_what_is_not_for_its_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request_: Any, why: str) -> None:
    listener, stream = _listener(tmp_path, monkeypatch)
    answer = asyncio.run(listener.answer(json.dumps(request_).encode()))
    assert answer["ok"] is False and why in answer["error"] and stream.sent == []


def test_install_prints_the_plugin_and_how_to_start_the_session(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "p.db")
    out = claude_code.install(settings, str(tmp_path))
    assert out["mode"] == "plugin" and out["written"] is None
    assert out["start"] == "claude --dangerously-load-development-channels plugin:promptyoself@promptyoself-local"
    server = out["files"]["plugins/promptyoself/.mcp.json"]["mcpServers"]["promptyoself"]
    assert server["env"]["PROMPTYOSELF_DB"] == settings.db_url
    assert out["commands"][-1] == f"claude plugin install --scope local {claude_plugin.REF}"
    skill = out["files"][f"plugins/promptyoself/skills/{claude_plugin.SKILL}/SKILL.md"]
    assert skill.startswith(f"---\nname: {claude_plugin.SKILL}\ndescription: ") and "CronCreate" in skill
    assert "mcp_json" not in out and not (tmp_path / ".mcp.json").exists()  # one registration: the plugin
    plain = claude_code.install(settings, str(tmp_path), mcp_json=True)
    assert plain["mode"] == "mcp_json" and "claude mcp add" in plain["claude_mcp_add"]


def test_readiness_says_when_no_open_session_runs_the_channel(tmp_path: Path) -> None:
    (tmp_path / "sessions").mkdir()
    (tmp_path / "sessions" / "999999999.json").write_text(json.dumps({"sessionId": SESSION, "cwd": "/w"}))  # gone
    text = readiness(tmp_path)
    assert text.startswith("live delivery (Channels) not available") and "(0 open)" in text


def _request(method: str, rid: int | str, params: dict[str, Any] | None = None) -> Any:
    import mcp_types
    from mcp.shared.message import SessionMessage

    return SessionMessage(mcp_types.JSONRPCRequest(jsonrpc="2.0", id=rid, method=method, params=params))


INITIALIZE = {"protocolVersion": "2025-11-25", "capabilities": {"roots": {"listChanged": True}},
              "clientInfo": {"name": "claude-code", "version": "2.1.328"}}
DISCOVER = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}


def test_the_plugin_server_refuses_server_discover_so_claude_code_falls_back_to_initialize(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claude Code 2.1.328 opens with ``server/discover`` (2026-07-28); answered, the connection is
    "modern" and it skips channel notifications. The plugin server's handshake answers it -32601
    itself (FastMCP never sees it), passes everything else on, and keeps what ``initialize`` said for
    ``hello``."""
    listener, stream = _listener(tmp_path, monkeypatch)
    to_server, from_client = anyio.create_memory_object_stream[Any](10)
    to_fastmcp, fastmcp_reads = anyio.create_memory_object_stream[Any](10)
    passed: list[Any] = []

    async def scenario() -> dict[str, Any]:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(listener.handshake, from_client, to_fastmcp)
            await to_server.send(_request("server/discover", "server-discover-probe-1", DISCOVER))
            await to_server.send(_request("initialize", 0, INITIALIZE))
            await to_server.send(_request("tools/list", 1))
            await to_server.aclose()
            async with fastmcp_reads:
                passed.extend([item async for item in fastmcp_reads])
        return await listener.answer(b'{"op": "hello"}')

    hello = anyio.run(scenario)
    [refusal] = stream.sent
    wire = json.loads(refusal.message.model_dump_json(by_alias=True, exclude_unset=True))
    assert wire["id"] == "server-discover-probe-1" and wire["error"]["code"] == -32601
    assert [m.message.method for m in passed] == ["initialize", "tools/list"]
    assert hello["client"] == {"protocol": "2025-11-25", "name": "claude-code", "version": "2.1.328"}
    assert judge(hello) == (True, "claude-code 2.1.328, MCP 2025-11-25")


@pytest.mark.parametrize(("answer", "ok", "why"), [
    ({"ok": True, "session_id": SESSION, "channels": True, "client": None}, False, "without initialize"),
    ({"ok": True, "session_id": SESSION, "channels": True}, False, "predates"),
    (None, False, "does not answer"),
    ({"ok": True, "client": {"protocol": "2025-11-25", "name": "claude-code", "version": "2.1.197"}}, True, "2.1.197"),
])
def test_a_session_counts_as_live_only_when_its_server_got_initialize(
        answer: dict[str, Any] | None, ok: bool, why: str) -> None:
    """health's "live delivery (Channels) available" needs the 2025 handshake (issue 45: it said
    available while Claude Code 2.1.328 skipped the channel of a modern connection)."""
    got, reason = judge(answer)
    assert got is ok and why in reason


def test_readiness_counts_only_sessions_whose_channel_can_register(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two open sessions run our channel; one server got Claude Code's initialize, the other's
    connection is of the 2026-07-28 era: one of two is available, and health says why not the other."""
    import os

    from promptyoself.targets.claude_code import channel

    live, modern = sorted((os.getpid(), os.getppid()))
    (tmp_path / "sessions").mkdir()
    for pid in (live, modern):
        (tmp_path / "sessions" / f"{pid}.json").write_text(json.dumps({"pid": pid, "sessionId": SESSION}))
    answers = {live: {"ok": True, "client": {"protocol": "2025-11-25", "name": "claude-code", "version": "2.1.328"}},
               modern: {"ok": True, "client": None}}
    monkeypatch.setattr(channel, "channels_on", lambda pid, plugin=channel.PLUGIN: True)
    monkeypatch.setattr(channel, "channel_state", lambda pid: channel.judge(answers[pid]))
    text = readiness(tmp_path)
    assert text.startswith("live delivery (Channels) available in 1 of 2 open session(s)")
    assert f"claude pid {modern}: Claude Code connected to its PromptYoSelf server without initialize" in text
    answers[live] = {"ok": True, "client": None}
    assert readiness(tmp_path).startswith("live delivery (Channels) not available")
