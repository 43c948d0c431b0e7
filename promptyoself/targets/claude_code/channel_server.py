"""The stdio MCP server's half of live delivery into Claude Code (issue 31 point 3; the delivering half
is ``promptyoself.targets.claude_code.channel``).

When this server runs as a Claude Code plugin (``CLAUDE_PLUGIN_ROOT`` set by Claude Code, which only
routes channel notifications of plugin-sourced servers), it

- declares the experimental capability ``claude/channel`` in its ``initialize`` answer, and
- listens on ``<runtime dir>/promptyoself/cc-<claude pid>.sock`` (0600 in a 0700 folder; the parent
  process is the ``claude`` that started it; sockets of ``claude`` processes that are gone are removed
  when the next one starts), where a delivering process of the same user hands it
  ``{"op": "push", "session_id", "content", "meta"}``. The push is written to Claude Code as
  ``notifications/claude/channel`` ``{"content", "meta"}`` on this server's stdout, beside FastMCP's
  own messages (the same stream), and only when ``session_id`` is the session this ``claude`` holds
  now (``sessions/<pid>.json``, which follows ``/clear``). Connections from another user are closed
  without a word (``SO_PEERCRED``, like the stdio relay).

Claude Code 2.1.328 opens with MCP's ``server/discover`` (protocol 2026-07-28) before ``initialize``;
answered, the connection is "modern" and Claude Code skips channels on it ("Channel notifications
skipped: connection negotiated a modern protocol revision with no unsolicited notification path").
So in this mode (and only here) ``server/discover`` is answered with JSON-RPC -32601 (method not
found) before FastMCP sees it: the client falls back to ``initialize`` (2025-11-25), the 2025
handshake that keeps Channels, exactly as it does with a server that predates 2026-07-28. 2.1.197
never sends ``server/discover``. The ``initialize`` the client sent (protocol version, client name
and version) is kept and told in the socket's ``hello`` answer: the delivering side's sign that the
channel can register (``channel.channel_state``).

Whether the session is idle and whether the prompt arrived are the delivering side's business: it
reads the session's transcript. Anywhere else (not under Claude Code, or not a plugin) the server runs
as FastMCP's plain stdio server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import stat
from collections.abc import AsyncIterator, Mapping
from typing import Any

import promptyoself.targets.claude_code.session as claude_code
from promptyoself.processes import pid_alive

log = logging.getLogger(__name__)

CAPABILITY = "claude/channel"
METHOD = "notifications/claude/channel"
DISCOVER = "server/discover"
MAX_LINE = 1024 * 1024
MAX_CONTENT = 256 * 1024


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return claude_code.in_claude_code(env) and bool(env.get("CLAUDE_PLUGIN_ROOT"))


def serve_stdio(mcp: Any) -> bool:
    """Our ``promptyoself.stdio`` hook (pyproject.toml, ``registry.BUILT_IN_STDIO``): when this server is
    a Claude Code plugin, run the stdio MCP server with the channel and return True once it has run;
    elsewhere return False at once (the face runs FastMCP's plain stdio server)."""
    if not wanted():
        return False
    import anyio

    mcp.experimental_capabilities[CAPABILITY] = {}
    anyio.run(_serve, mcp)
    return True


async def _serve(mcp: Any) -> None:
    """FastMCP's ``run_stdio_async`` (fastmcp 4.x), with the write stream shared with the listener and
    the client's messages passed through ``ChannelListener.handshake`` (``server/discover`` refused)."""
    import anyio
    from fastmcp.server.context import reset_transport, set_transport
    from mcp.server.stdio import stdio_server

    token = set_transport("stdio")
    try:
        async with mcp._lifespan_manager(), stdio_server() as (read_stream, write_stream):
            listener = ChannelListener(write_stream, os.getppid())
            legacy_send, legacy_read = anyio.create_memory_object_stream[Any](0)
            async with listener.serving(), anyio.create_task_group() as tasks:
                tasks.start_soon(listener.handshake, read_stream, legacy_send)
                await mcp._mcp_server.run(legacy_read, write_stream,
                                          mcp._mcp_server.create_initialization_options())
                tasks.cancel_scope.cancel()
    finally:
        reset_transport(token)


class ChannelListener:
    """The private socket of one ``claude``'s plugin server (see the module's docstring)."""

    def __init__(self, write_stream: Any, claude_pid: int) -> None:
        self.write_stream = write_stream
        self.claude_pid = claude_pid
        self.path = claude_code.channel_socket(claude_pid)
        self._inode: int | None = None
        self.client: dict[str, Any] | None = None  # what the client's initialize said
        self.discover_refused = 0

    async def handshake(self, incoming: Any, outgoing: Any) -> None:
        """Relay the client's messages to FastMCP, except ``server/discover``: answered -32601 here, so
        the connection is a 2025 (``initialize``) one, where Claude Code routes channel notifications.
        Keeps what ``initialize`` says about the client for ``hello``."""
        import mcp_types
        from mcp.shared.message import SessionMessage

        async with outgoing:
            async for item in incoming:
                message = getattr(item, "message", None)
                if isinstance(message, mcp_types.JSONRPCRequest) and message.method == DISCOVER:
                    self.discover_refused += 1
                    error = mcp_types.ErrorData(code=mcp_types.METHOD_NOT_FOUND,
                                                message=f"Method not found: {DISCOVER}")
                    await self.write_stream.send(SessionMessage(
                        mcp_types.JSONRPCError(jsonrpc="2.0", id=message.id, error=error)))
                    log.info("Claude Code channel: answered %s with -32601 (the 2025 handshake keeps Channels)",
                             DISCOVER)
                    continue
                if isinstance(message, mcp_types.JSONRPCRequest) and message.method == "initialize":
                    self.client = _client_of(message.params or {})
                await outgoing.send(item)

    def session_id(self) -> str | None:
        found = claude_code.live_session_of(self.claude_pid, claude_code.claude_home())
        return found[0] if found else None

    def _prepare(self) -> bool:
        folder = os.path.dirname(self.path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            log.warning("Claude Code channel off: %s is not a private folder of this user", folder)
            return False
        self._prune(folder)
        if os.path.lexists(self.path):  # a socket left by an earlier server of a claude with this pid
            if not stat.S_ISSOCK(os.lstat(self.path).st_mode):
                log.warning("Claude Code channel off: %s exists and is not a socket", self.path)
                return False
            os.unlink(self.path)
        return True

    @staticmethod
    def _prune(folder: str) -> None:
        """Sockets of ``claude`` processes that are gone: a server ended by a signal (Claude Code
        stopping its servers) leaves its socket behind."""
        for name in os.listdir(folder):
            pid = name.removeprefix("cc-").removesuffix(".sock")
            if name.startswith("cc-") and name.endswith(".sock") and pid.isdigit() and not pid_alive(int(pid)):
                with contextlib.suppress(OSError):
                    if stat.S_ISSOCK(os.lstat(os.path.join(folder, name)).st_mode):
                        os.unlink(os.path.join(folder, name))

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[ChannelListener]:
        server: asyncio.AbstractServer | None = None
        try:
            if await asyncio.to_thread(self._prepare):
                server = await asyncio.start_unix_server(self._client, self.path, limit=MAX_LINE)
                os.chmod(self.path, 0o600)
                self._inode = os.stat(self.path).st_ino
                log.info("Claude Code channel: listening on %s for claude pid %s", self.path, self.claude_pid)
        except OSError as exc:
            log.warning("Claude Code channel off: cannot listen on %s: %s", self.path, exc)
        try:
            yield self
        finally:
            if server is not None:
                server.close()
            with contextlib.suppress(OSError):
                if self._inode is not None and os.stat(self.path).st_ino == self._inode:
                    os.unlink(self.path)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if claude_code.channel_peer_uid(writer.get_extra_info("socket")) != os.getuid():
                log.warning("Claude Code channel: refused a connection from another user")
                return
            line = await asyncio.wait_for(reader.readline(), 10)
            answer = await self.answer(line)
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (OSError, TimeoutError, ValueError) as exc:
            log.warning("Claude Code channel: a request failed: %s", exc)
        finally:
            writer.close()

    async def answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
        except ValueError:
            return {"ok": False, "error": "not a JSON line"}
        if not isinstance(request, dict):
            return {"ok": False, "error": "not a JSON object"}
        current = await asyncio.to_thread(self.session_id)
        if request.get("op") == "hello":
            return {"ok": True, "session_id": current, "channels": claude_code.channels_on(self.claude_pid),
                    "client": self.client, "discover_refused": self.discover_refused}
        if request.get("op") != "push":
            return {"ok": False, "error": "unknown op"}
        content, meta = request.get("content"), request.get("meta") or {}
        if not isinstance(content, str) or not content or len(content) > MAX_CONTENT:
            return {"ok": False, "error": f"content must be a text of 1..{MAX_CONTENT} characters"}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            return {"ok": False, "error": "meta must map names to texts"}
        if current is None or request.get("session_id") != current:
            return {"ok": False, "error": f"this claude (pid {self.claude_pid}) holds session {current}, "
                                          f"not {request.get('session_id')}"}
        await self.notify(content, meta)
        log.info("Claude Code channel: pushed occurrence %s into session %s", meta.get("occurrence_id"), current)
        return {"ok": True, "session_id": current}

    async def notify(self, content: str, meta: Mapping[str, str]) -> None:
        import mcp_types
        from mcp.shared.message import SessionMessage

        note = mcp_types.JSONRPCNotification(jsonrpc="2.0", method=METHOD,
                                             params={"content": content, "meta": dict(meta)})
        await self.write_stream.send(SessionMessage(note))


def _client_of(params: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an ``initialize`` request's params that ``hello`` reports."""
    info = params.get("clientInfo")
    info = info if isinstance(info, dict) else {}
    return {"protocol": str(params.get("protocolVersion") or ""), "name": str(info.get("name") or ""),
            "version": str(info.get("version") or "")}
