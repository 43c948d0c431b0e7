"""The stdio relay: a stdio MCP process that hands its stdin and stdout to the service.

Letta starts a new stdio server for every tool call; importing the ``mcp`` SDK alone takes ~0.7 s.
When a service (``promptyoself serve``) runs for the same database on this machine, it listens on a
Unix socket (promptyoself.faces.relay_server) and runs each connection as a stdio MCP session of its
own FastMCP app. The short-lived process then only:

1. works out the database URL the way ``Settings.db_url`` does (environment, then the ``.env`` file),
2. connects to ``<runtime dir>/mcp-<hash of the database URL>.sock`` and sends one handshake line
   (the database URL and the PROMPTYOSELF_* / LETTA_* settings this process sees),
3. on ``{"ok": true}`` copies bytes both ways (stdin to the socket, the socket to stdout) until EOF.

Standard library only (plus platformdirs, for the same per-user directories as the rest of the
program): no mcp, fastmcp, pydantic or SQLAlchemy. Anything else (no socket, refused, a stale
socket, a handshake refused or not answered within ``HANDSHAKE_TIMEOUT``) and the caller runs
today's in-process server; nothing has been read from stdin by then. ``PROMPTYOSELF_STDIO_RELAY=off``
turns the relay off.
"""

from __future__ import annotations

import json
import os
import select
import socket
import stat
import struct
import sys

try:  # the built-in module: hashlib would load OpenSSL (~5 ms)
    from _sha256 import sha256  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Python >= 3.12 names it _sha2
    try:
        from _sha2 import sha256  # type: ignore[import-not-found,no-redef]
    except ImportError:
        from hashlib import sha256  # type: ignore[assignment]

PROTOCOL = 1
HANDSHAKE_TIMEOUT = 5.0  # the in-process fallback itself takes 1-5 s; a busy service is still quicker
RELAY_ENV = "PROMPTYOSELF_STDIO_RELAY"
PREFIXES = ("PROMPTYOSELF_", "LETTA_")
CHUNK = 65536
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux, 104 on macOS


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in ("'", '"'):
        inner = value[1:-1]
        if value[0] == '"':
            for escaped, plain in (("\\n", "\n"), ("\\t", "\t"), ('\\"', '"'), ("\\\\", "\\")):
                inner = inner.replace(escaped, plain)
        return inner
    if " #" in value:
        value = value.split(" #", 1)[0].rstrip()
    return value


def read_env_file(path: str | None) -> dict[str, str]:
    """``KEY=VALUE`` lines of a ``.env`` file (``export`` prefixes, quotes and comments allowed), keys
    upper-cased as the settings read them case-insensitively. A line this cannot read is skipped:
    a value read differently from the service makes the handshake fail, never a wrong relay."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError):
        return {}
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, _, value = line.partition("=")
        out[key.strip().upper()] = _unquote(value)
    return out


def env_file_path() -> str | None:
    """As ``promptyoself.config.env_file``: ``PROMPTYOSELF_ENV_FILE``, else ``./.env`` if it exists."""
    explicit = os.environ.get("PROMPTYOSELF_ENV_FILE")
    if explicit:
        return explicit
    return ".env" if os.path.isfile(".env") else None


def visible_settings() -> dict[str, str]:
    """The PROMPTYOSELF_* and LETTA_* values this process's settings would read: the ``.env`` file
    overridden by the environment (as pydantic-settings does)."""
    found = {k: v for k, v in read_env_file(env_file_path()).items() if k.startswith(PREFIXES)}
    for key, value in os.environ.items():
        upper = key.upper()
        if upper.startswith(PREFIXES):
            found[upper] = value
    return found


def db_url_from(values: dict[str, str]) -> str:
    """``Settings.db_url`` for these values: a URL as is, a path made absolute, or the per-user default."""
    raw = (values.get("PROMPTYOSELF_DB") or "").strip()
    if "://" in raw:
        return raw
    if raw:
        path = os.path.expanduser(raw)
    else:
        from platformdirs import user_data_dir

        path = os.path.join(user_data_dir("promptyoself", appauthor=False), "promptyoself.db")
    return f"sqlite:///{os.path.realpath(path)}"


def _private_dir(path: str) -> bool:
    """A real directory (not a symlink) of this user that no one else may enter (what XDG asks of a
    runtime dir)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def safe_ancestors(path: str) -> bool:
    """No one but this user (or root) can rename, replace or add entries in ``path`` or above it:
    ``path`` itself a real directory of ours that only we may write, each folder above it owned by
    us or root and writable by others only with the sticky bit (``/tmp``)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    uid = os.getuid()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
        return False
    here = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    while True:
        try:
            st = os.stat(here)
        except OSError:
            return False
        if st.st_uid not in (0, uid) or (st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX):
            return False
        parent = os.path.dirname(here)
        if parent == here:
            return True
        here = parent


def trusted_folder(folder: str) -> bool:
    """Our relay folder can be trusted with credentials: private to this user (0700, ours, not a
    symlink) inside a parent no one else can write to (so no one can swap it between a check and a
    connect)."""
    return _private_dir(folder) and safe_ancestors(os.path.dirname(folder))


def peer_uid(sock: socket.socket) -> int | None:
    """The user id of the process at the other end of a connected Unix socket (``SO_PEERCRED`` on
    Linux, ``LOCAL_PEERCRED`` on macOS and the BSDs), or None where the system cannot tell. Also
    given asyncio's ``TransportSocket``, which has the same ``getsockopt``."""
    try:
        if hasattr(socket, "SO_PEERCRED"):
            raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return int(struct.unpack("3i", raw)[1])
        local_peercred = getattr(socket, "LOCAL_PEERCRED", None)
        if local_peercred is not None:  # struct xucred: u_int version, uid_t uid, short ngroups, ...
            raw = sock.getsockopt(0, local_peercred, struct.calcsize("IIh16I"))
            return int(struct.unpack_from("II", raw)[1])
    except OSError:
        return None
    return None


def peer_is_us(sock: socket.socket) -> bool:
    """The other end runs as this user: a socket of someone else's never gets our settings, and the
    service never serves another user's session."""
    return peer_uid(sock) == os.getuid()


def runtime_dir(*, create: bool = False) -> str:
    """``<per-user runtime dir>/promptyoself``, as platformdirs' ``user_runtime_dir`` finds it:
    ``$XDG_RUNTIME_DIR`` when it is a private directory of this user, else ``/run/user/<uid>``, else
    ``<tmp>/runtime-<uid>`` (made 0700 with ``create``). On Linux this is worked out here, without
    importing platformdirs (a failed relay attempt then costs the in-process start next to nothing);
    elsewhere platformdirs decides."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if xdg and os.path.isabs(xdg) and _private_dir(xdg):
        return os.path.join(xdg, "promptyoself")
    if sys.platform.startswith("linux"):
        uid = os.getuid()
        if _private_dir(f"/run/user/{uid}"):
            return f"/run/user/{uid}/promptyoself"
        tmp = next((os.environ[k] for k in ("TMPDIR", "TEMP", "TMP") if os.environ.get(k)), "/tmp")
        fallback = os.path.join(tmp, f"runtime-{uid}")
        if create and not os.path.lexists(fallback):
            os.makedirs(fallback, mode=0o700, exist_ok=True)
        return os.path.join(fallback, "promptyoself")
    import warnings

    from platformdirs import user_runtime_dir

    with warnings.catch_warnings():  # platformdirs warns when it falls back; the fallback is fine
        warnings.simplefilter("ignore")
        return str(user_runtime_dir("promptyoself", appauthor=False, ensure_exists=create))


def socket_path(db_url: str) -> str:
    """The service's socket for this database: one per database URL, never shared by two."""
    digest = sha256(db_url.encode("utf-8")).hexdigest()[:24]
    return os.path.join(runtime_dir(), f"mcp-{digest}.sock")


def relay_enabled(values: dict[str, str]) -> bool:
    return (values.get(RELAY_ENV) or "auto").strip().lower() != "off"


def connect(values: dict[str, str], timeout: float = HANDSHAKE_TIMEOUT) -> socket.socket | None:
    """A socket to a service for this database that accepted our handshake, else None."""
    db_url = db_url_from(values)
    path = socket_path(db_url)
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        return None
    try:  # our settings (credentials included) go only to a socket of ours, in a folder of ours
        if not trusted_folder(os.path.dirname(path)) or os.lstat(path).st_uid != os.getuid():
            return None
    except OSError:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        if not peer_is_us(sock):  # checked on the connection itself: a folder swapped after the check
            raise OSError("the socket's listener is another user")
        # the database as resolved here (a relative path means this process's working directory)
        settings = {**values, "PROMPTYOSELF_DB": db_url}
        hello = {"promptyoself_relay": PROTOCOL, "db": db_url, "settings": settings, "pid": os.getpid()}
        sock.sendall(json.dumps(hello).encode("utf-8") + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            part = sock.recv(4096)
            if not part or len(reply) > 65536:
                raise OSError("the service closed the socket during the handshake")
            reply += part
        answer = json.loads(reply)
        if not (isinstance(answer, dict) and answer.get("ok") is True):
            raise OSError(str(answer.get("reason") if isinstance(answer, dict) else answer)[:300])
        sock.settimeout(None)
        return sock
    except (OSError, ValueError):
        sock.close()
        return None


def pump(sock: socket.socket, stdin_fd: int = 0, stdout_fd: int = 1) -> int:
    """Copy stdin to the socket and the socket to stdout until the service closes its side."""
    stdin_open = True
    try:
        while True:
            watch: list[socket.socket | int] = [sock, stdin_fd] if stdin_open else [sock]
            ready, _, _ = select.select(watch, [], [])
            if stdin_fd in ready:
                data = os.read(stdin_fd, CHUNK)
                if data:
                    sock.sendall(data)
                else:
                    stdin_open = False
                    sock.shutdown(socket.SHUT_WR)
            if sock in ready:
                data = sock.recv(CHUNK)
                if not data:
                    return 0
                view = memoryview(data)
                while view:
                    written = os.write(stdout_fd, view)
                    view = view[written:]
    except (BrokenPipeError, ConnectionResetError):
        return 0
    except KeyboardInterrupt:  # Ctrl-C on a relay started by hand: exit 130 like the server, no traceback
        return 130
    finally:
        sock.close()


def try_relay() -> int | None:
    """Relay this process's stdio to a service for the same database; the exit code, or None
    when no service took it (run the in-process server then)."""
    values = visible_settings()
    if not relay_enabled(values) or os.name != "posix":
        return None
    from promptyoself.targets import serves_in_process

    if serves_in_process():
        # an agent CLI that keeps its MCP server for the whole session (no start-up per call to save),
        # whose schedules go back to that session: found from this process's environment and parent,
        # which a service answering over the relay would not see
        return None
    try:
        sock = connect(values)
    except Exception:
        return None
    if sock is None:
        return None
    dump_loaded_modules()
    return pump(sock)


STDIO_FLAGS = ("--no-executor", "--allow-external")
VALUE_FLAGS = ("--host", "--port", "--path")


def is_stdio_args(argv: list[str], *, default_stdio: bool) -> bool:
    """True when these ``serve`` arguments run the stdio transport (the only one the relay serves).
    Anything unusual (help, a typo) is left to the real parser: no relay."""
    transport = "stdio" if default_stdio else None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--transport" and i + 1 < len(argv):
            transport = argv[i + 1]
            i += 2
            continue
        if arg.startswith("--transport="):
            transport = arg.split("=", 1)[1]
        elif arg in VALUE_FLAGS and i + 1 < len(argv):
            i += 2
            continue
        elif arg.split("=", 1)[0] not in (*STDIO_FLAGS, *VALUE_FLAGS):
            return False
        i += 1
    return transport == "stdio"


def dump_loaded_modules() -> None:
    """Tests: write the names of the modules this process loaded to ``PROMPTYOSELF_RELAY_DUMP_MODULES``
    (a relayed process must load none of the server's)."""
    path = os.environ.get("PROMPTYOSELF_RELAY_DUMP_MODULES")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("\n".join(sorted(sys.modules)))
