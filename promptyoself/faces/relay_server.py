"""The service's end of the stdio relay (promptyoself.faces.relay): a Unix socket whose every
connection is a stdio MCP session of the service's own tools.

The socket is ``<per-user runtime dir>/mcp-<hash of the database URL>.sock``, mode 0600 in a 0700
folder. A connection starts with one handshake line from the relay (its database URL and the
PROMPTYOSELF_* / LETTA_* settings it sees); the service answers ``{"ok": true}`` only when the relay's
settings name the same database and the same Letta server and credentials, and otherwise
``{"ok": false, "reason": ...}`` (the relay then runs the in-process server). After that the
connection carries newline-delimited JSON-RPC exactly as a stdio pipe does.

Each session behaves as a fresh stdio process would: its own ``Core`` (the relay's settings, its own
process and scoped default agents, its own tool-call count) over the service's store and Letta
client. The FastMCP app serving it is bound to that core through a ``CoreSlot`` and reused by later
sessions, one at a time; spare apps are kept ready. (An app took ~60 ms to build when each built its
own tools; ``faces.mcp.build_server`` now reuses the module's, ~0.2 ms, so the pool saves little.)
Writes in a session wake the service's executor at once (``Core.on_change``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from promptyoself.config import Settings
from promptyoself.core.agents import RELAYED
from promptyoself.core.operations import Core
from promptyoself.faces.relay import (
    MAX_SOCKET_PATH,
    PROTOCOL,
    peer_is_us,
    peer_uid,
    safe_ancestors,
    socket_path,
    trusted_folder,
)

log = logging.getLogger(__name__)

LINE_LIMIT = 64 * 1024 * 1024  # one JSON-RPC message per line; uploads may be large
HANDSHAKE_WAIT = 5.0
SPARES = 2
IDLE_APPS = 16
MUST_MATCH = ("db_url", "letta_base_url", "letta_token", "letta_timeout")
"""Settings a relayed session must share with the service: it uses the service's store and Letta client."""


def _own_folder(folder: str) -> bool:
    """Make ``folder`` this user's private relay folder (created 0700, or an existing one of ours set
    to 0700), never through a symlink and only inside a parent no one else can write to. False,
    with the reason logged, when it is not ours to use."""
    parent = os.path.dirname(folder)
    if not safe_ancestors(parent):
        log.warning("stdio relay off: %s is not a folder of this user that only it can write to", parent)
        return False
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    try:  # O_NOFOLLOW: a symlink planted at the folder's path is refused, never chmod-ed through
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        log.warning("stdio relay off: %s is not a real folder", folder)
        return False
    try:
        if os.fstat(fd).st_uid != os.getuid():
            log.warning("stdio relay off: %s belongs to another user", folder)
            return False
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    if not trusted_folder(folder):
        log.warning("stdio relay off: %s is not a private folder of this user", folder)
        return False
    return True


class _GivenSettings(Settings):
    """Settings from the relay's values only (not this process's environment or ``.env``)."""

    @classmethod
    def settings_customise_sources(cls, settings_cls: Any, init_settings: Any, *args: Any, **kwargs: Any) -> Any:
        return (init_settings,)


def session_settings(values: object) -> Settings:
    """The relay's settings, as its own process would have read them. Raises ValueError when invalid."""
    if not isinstance(values, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
        raise ValueError("the settings must be an object of strings")
    try:
        return _GivenSettings(**values)
    except Exception as exc:  # pydantic's ValidationError: the relay's own server would refuse to start
        raise ValueError("the relay's settings are invalid") from exc


def mismatch(mine: Settings, theirs: Settings) -> str | None:
    """The first setting that keeps this session out of the service, or None."""
    for name in MUST_MATCH:
        if getattr(mine, name) != getattr(theirs, name):
            return {"db_url": "another database", "letta_base_url": "another Letta server",
                    "letta_token": "other Letta credentials", "letta_timeout": "another Letta timeout"}[name]
    return None


class _Lines:
    """The socket's incoming lines, as ``stdio_server`` reads stdin (``async for line in stdin``)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        try:
            line = await self.reader.readline()
        except (ConnectionError, ValueError):  # reset by the relay, or a line over LINE_LIMIT
            line = b""
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


class _Out:
    """The socket's outgoing side, as ``stdio_server`` writes stdout (``write`` then ``flush``)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def write(self, text: str) -> None:
        if not self.writer.is_closing():
            self.writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()


class CoreSlot:
    """Stands for the ``Core`` of whichever session an app serves now: a FastMCP app is bound to a
    slot once and reused by one session after another, each with a fresh ``Core``. Attribute reads
    and writes go to that core."""

    def __init__(self) -> None:
        object.__setattr__(self, "_core", None)

    def bind(self, core: Core | None) -> None:
        object.__setattr__(self, "_core", core)

    def __getattr__(self, name: str) -> Any:
        core = object.__getattribute__(self, "_core")
        if core is None:
            raise RuntimeError("no session is bound to this app")
        return getattr(core, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_core"), name, value)


class RelayListener:
    """``async with RelayListener(core, build_server).serving():`` accepts relayed stdio sessions until
    the block ends; ``build`` makes the FastMCP app of a session's core (``faces.mcp.build_server``)."""

    def __init__(self, core: Core, build: Callable[[Core], Any]) -> None:
        self.core = core
        self.build = build
        self.path = socket_path(core.settings.db_url)
        self.server: asyncio.AbstractServer | None = None
        self._inode: int | None = None
        self._spares: list[tuple[CoreSlot, Any]] = []  # apps no session uses now
        self._tasks: set[asyncio.Task[Any]] = set()
        self.sessions = 0

    # ---- the socket ----------------------------------------------------------------------------

    def _bind(self) -> socket.socket | None:
        from promptyoself.faces.relay import runtime_dir

        path = self.path
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            log.warning("stdio relay off: the socket path %s is too long", path)
            return None
        folder = runtime_dir(create=True)
        if not _own_folder(folder):
            return None
        if os.path.lexists(path):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                log.warning("stdio relay off: %s exists and is not a socket", path)
                return None
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(0.5)
            try:
                probe.connect(path)
            except OSError:  # stale: its service is gone
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            else:
                log.warning("stdio relay off: another service already listens on %s", path)
                return None
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, 0o600)
            sock.listen(64)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._inode = os.stat(path).st_ino
        return sock

    def _unlink(self) -> None:
        with contextlib.suppress(OSError):
            if self._inode is not None and os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[RelayListener]:
        try:
            sock = await asyncio.to_thread(self._bind)
        except OSError as exc:
            log.warning("stdio relay off: cannot listen on %s: %s", self.path, exc)
            sock = None
        if sock is not None:
            self.server = await asyncio.start_unix_server(self._handle, sock=sock, limit=LINE_LIMIT)
            log.info("stdio relay: stdio servers for this database hand their sessions to %s", self.path)
            self._spawn(self._warm())
        try:
            yield self
        finally:
            if self.server is not None:
                self.server.close()
                self._unlink()
                for task in list(self._tasks):
                    task.cancel()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.server.wait_closed(), timeout=2.0)

    # ---- sessions ------------------------------------------------------------------------------

    def _build(self) -> tuple[CoreSlot, Any]:
        slot = CoreSlot()
        return slot, self.build(slot)  # type: ignore[arg-type]

    def _replenish(self, delay: float) -> None:
        async def fill() -> None:
            await asyncio.sleep(delay)
            while len(self._spares) < SPARES:
                self._spares.append(await asyncio.to_thread(self._build))

        self._spawn(fill())

    async def _warm(self) -> None:
        """One session (initialize, tools/list) over a socket pair, so that the first relayed
        session does not pay the imports and first-call set-up (~1 s) of the MCP session path."""
        here, there = socket.socketpair()
        lines = [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "promptyoself-warm-up", "version": "0"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        ]

        def client() -> None:
            # The service may stop (Ctrl-C, SIGTERM) in the middle of the warm-up: its end of the pair
            # then closes under this thread, which is no error worth a traceback.
            with contextlib.suppress(OSError), there, there.makefile("rwb") as fh:
                fh.write((json.dumps(lines[0]) + "\n").encode())
                fh.flush()
                fh.readline()
                fh.write("".join(json.dumps(m) + "\n" for m in lines[1:]).encode())
                fh.flush()
                fh.readline()
                there.shutdown(socket.SHUT_WR)
                fh.read()

        try:
            reader, writer = await asyncio.open_unix_connection(sock=here, limit=LINE_LIMIT)
            slot, app = await self._take(self.core.settings)
            talk = asyncio.ensure_future(asyncio.to_thread(client))
            try:
                await self._session(slot, app, reader, writer)
            finally:
                writer.close()
            await asyncio.wait_for(talk, timeout=10.0)
        except Exception as exc:  # only slower first sessions
            log.debug("stdio relay: warm-up failed: %s", exc)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _take(self, settings: Settings) -> tuple[CoreSlot, Any]:
        """An idle app (or a new one) bound to a fresh ``Core``: the session's settings, its own
        default agents and counters, the service's store and Letta client."""
        slot, app = self._spares.pop() if self._spares else await asyncio.to_thread(self._build)
        if not self._spares:
            self._replenish(0.3)
        core = Core(settings, store=self.core.store, letta=self.core.letta, clock=self.core.clock)
        core.on_change(self.core.changed)  # a write in the session wakes the service's executor
        slot.bind(core)
        return slot, app

    def _give_back(self, slot: CoreSlot, app: Any) -> None:
        slot.bind(None)
        if len(self._spares) < IDLE_APPS:
            self._spares.append((slot, app))

    async def _handshake(self, reader: asyncio.StreamReader) -> tuple[Settings | None, str]:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=HANDSHAKE_WAIT)
            hello = json.loads(line)
        except (TimeoutError, ValueError, ConnectionError):
            return None, "no handshake"
        if not isinstance(hello, dict) or hello.get("promptyoself_relay") != PROTOCOL:
            return None, "unknown relay protocol"
        if hello.get("db") != self.core.settings.db_url:
            return None, "this service serves another database"
        try:
            theirs = session_settings(hello.get("settings"))
        except ValueError as exc:
            return None, str(exc)
        why = mismatch(self.core.settings, theirs)
        if why is not None:
            return None, f"the relay's settings name {why}"
        if theirs.executor_enabled and not self.core.settings.executor_enabled:
            return None, "this service does not deliver and the relay's settings want delivery"
        return theirs, ""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            sock = writer.get_extra_info("socket")
            if sock is None or not peer_is_us(sock):  # another user's process: not a word to it
                log.warning("stdio relay: refused a connection from user %s (this service runs as %s)",
                            None if sock is None else peer_uid(sock), os.getuid())
                return
            settings, reason = await self._handshake(reader)
            if settings is None:
                log.info("stdio relay: refused a session (%s); it runs in its own process", reason)
                writer.write(json.dumps({"ok": False, "reason": reason}).encode() + b"\n")
                await writer.drain()
                return
            writer.write(b'{"ok": true}\n')  # before the app is taken: building one may take a while
            await writer.drain()
            slot, app = await self._take(settings)
            self.sessions += 1
            await self._session(slot, app, reader, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("stdio relay: a session failed")
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _session(self, slot: CoreSlot, app: Any, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        """One stdio MCP session, as ``FastMCP.run_stdio_async`` runs it, over the socket; the app
        goes back to the idle ones afterwards."""
        from fastmcp.server.context import reset_transport, set_transport
        from mcp.server.stdio import stdio_server

        from promptyoself.delivery.service import DeliveryService, service_for

        # As a fresh stdio process: its delivery side exists when its settings enable delivery (the
        # service, holding the worker lease, is then the worker it sees).
        core: Core = object.__getattribute__(slot, "_core")
        if core.settings.executor_enabled:
            service_for(core)
        token = set_transport("stdio")
        relayed = RELAYED.set(True)  # the caller is the relaying process, not this one (issue 42 point 2)
        clean = False
        try:
            async with app._lifespan_manager():
                async with stdio_server(stdin=_Lines(reader), stdout=_Out(writer)) as (read_stream, write_stream):  # type: ignore[arg-type]
                    server = app._mcp_server
                    await server.run(read_stream, write_stream, server.create_initialization_options())
            clean = True
        finally:
            reset_transport(token)
            RELAYED.reset(relayed)
            started = core.delivery  # promptyoself_execute(loop=true) may have started a loop: it ends with us
            ex = started.executor if isinstance(started, DeliveryService) else None
            if isinstance(started, DeliveryService) and ex is not None and ex.role == "loop":
                await asyncio.to_thread(started.stop)
            if clean:  # an app whose session was cut short is not reused
                self._give_back(slot, app)

