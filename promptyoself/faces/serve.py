"""Starting the server: ``promptyoself serve`` and ``promptyoself_mcp_server.py``.

The ``serve`` arguments, the refusal to bind a non-loopback address without a token, and the choice of
what runs: the service (``promptyoself.faces.http``: delivery and one HTTP port) or the MCP server
alone (``promptyoself.faces.mcp``) on stdio, streamable HTTP or SSE. Both faces are imported only when
they start: the CLI reads these arguments without loading FastMCP.
"""

from __future__ import annotations

import argparse
import errno
import logging
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from promptyoself import __version__
from promptyoself.config import Settings, redact_url
from promptyoself.faces.serve_args import add_serve_arguments

if TYPE_CHECKING:
    from promptyoself.core.operations import Core

log = logging.getLogger(__name__)


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="promptyoself-mcp", description="Run the PromptYoSelf MCP server.")
    add_serve_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """``promptyoself_mcp_server.py`` / ``promptyoself serve``: run the MCP server (stdio by default)."""
    args = serve_parser().parse_args(argv)
    return serve(args)


def serve(args: argparse.Namespace) -> int:
    """Start the server for parsed ``serve`` arguments.

    Refuses (exit code 2, reason on stderr) to bind a non-loopback address without
    ``--allow-external`` and ``PROMPTYOSELF_HTTP_TOKEN``, to start on invalid configuration, and to
    start anything but the stdio server with ``PROMPTYOSELF_AGENT_TOKEN`` set.
    When a token is set, every HTTP/SSE request must carry it, whatever the bind address.
    Ctrl-C (SIGINT) ends it with exit code 130 and no traceback (promptyoself.faces.interrupt).
    """
    from promptyoself.faces.interrupt import EXIT_INTERRUPTED, SigintExits

    try:
        with SigintExits() as sigint:  # (the stdio server swaps in StdioSigintExits)
            code = _serve(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_INTERRUPTED if sigint.seen else code


AGENT_TOKEN_SERVE = (
    "Refusing to start the service with PROMPTYOSELF_AGENT_TOKEN set: the service (and serve --transport "
    "http|sse) is the operator's process, serving every agent; an agent token is for one agent's CLI or stdio "
    "MCP server. Unset PROMPTYOSELF_AGENT_TOKEN (environment or .env) to run the service."
)
"""Why ``serve`` (but for ``--transport stdio``, which an agent's token scopes) will not start under an
agent token (issue 42 item 9)."""

STDIO_TERMINAL_HINT = (
    "promptyoself: this is the MCP server; it speaks MCP (JSON-RPC) on stdin/stdout to a client such as "
    "Letta or Claude Desktop (see {readme}). For the command line run `promptyoself --help`. Ctrl-C quits."
)


def _readme() -> str:
    path = Path(__file__).resolve().parents[2] / "README_FASTMCP.md"
    return str(path) if path.is_file() else "README_FASTMCP.md"


def run_stdio(mcp: Any) -> None:
    """FastMCP's stdio server, unless a ``promptyoself.stdio`` hook runs it itself (an agent CLI's
    plug-in adds its live channel when this server runs as that CLI's plugin). The hooks are declared
    entry points (``registry.stdio_hooks``): no target's plug-in is loaded to decide."""
    from promptyoself.targets import registry

    for hook in registry.stdio_hooks():
        if hook(mcp):
            return
    mcp.run("stdio", show_banner=False)


def _stop_for_exit(core: Core) -> None:
    """After Ctrl-C in the stdio server: stop this process's delivery (in-flight sends get their
    grace), then close the store."""
    if core.delivery is not None:
        from promptyoself.delivery.service import DeliveryService

        if isinstance(core.delivery, DeliveryService):
            core.delivery.stop()
    core.close()


def _serve(args: argparse.Namespace) -> int:
    """The body of :func:`serve`, run under its SIGINT handling."""
    from promptyoself.config import ConfigError, load_settings
    from promptyoself.core.operations import Core
    from promptyoself.faces.mcp import build_server  # before setup_logging: it routes FastMCP's loggers
    from promptyoself.logs import add_secret_source, setup_logging
    from promptyoself.targets import registry

    try:
        settings = load_settings()
    except ConfigError as exc:  # one line on stderr naming the variable, nothing on stdout, exit 2
        return exc.report()
    if getattr(args, "no_executor", False):
        settings.executor_autostart = False
    add_secret_source(registry.secrets)  # the targets' own secrets, hidden from the first line on
    setup_logging(settings)
    transport = args.transport or "service"
    if transport != "stdio" and settings.agent_token is not None and settings.agent_token.get_secret_value().strip():
        sys.stderr.write(f"promptyoself: {AGENT_TOKEN_SERVE}\n")
        sys.stderr.flush()
        return 2
    if transport != "stdio":
        problem = check_exposure(args.host, args.allow_external, settings)
        if problem:
            sys.stderr.write(f"promptyoself: {problem}\n")
            sys.stderr.flush()
            return 2
    log.info(
        "PromptYoSelf %s starting: transport %s, database %s, Letta %s, executor %s",
        __version__,
        transport,
        redact_url(settings.db_url),
        redact_url(settings.letta_base_url),
        settings.executor_mode if settings.executor_enabled else "off",
    )
    from promptyoself.delivery.starter import at_launch, starter_for

    if transport == "service":  # `promptyoself serve`: its port first, then delivery in this process
        from promptyoself.faces.http import run_service

        try:
            sock = bind_port(args.host, args.port)
        except PortInUse as exc:
            sys.stderr.write(f"promptyoself: {exc}\n")
            sys.stderr.flush()
            return 2
        core = Core(settings)
        starter_for(core)  # who delivers after each write: this process's loop
        try:
            run_service(core, settings, sock=sock, mcp_path=args.path)
        finally:
            core.close()
        return 0
    if transport != "stdio":
        try:
            bind_port(args.host, args.port).close()  # say it in one line now, not in uvicorn's traceback later
        except PortInUse as exc:
            sys.stderr.write(f"promptyoself: {exc}\n")
            sys.stderr.flush()
            return 2
    # Before the handshake, in ~ms and without SQLAlchemy: Letta may end this process 30 ms after its
    # tools/list reply. Then, after every write, before the call answers: promptyoself.delivery.starter.
    at_launch(settings)
    core = Core(settings)
    starter_for(core)
    if settings.executor_enabled:  # worker/embedded: started after the handshake (promptyoself.faces.deferred)
        from promptyoself.faces.deferred import DeferredDelivery

        deferred = DeferredDelivery(core)
        mcp = build_server(core, lifespan=deferred.lifespan)
        mcp.add_middleware(deferred)
    else:
        mcp = build_server(core)
    try:
        if transport == "stdio":
            from promptyoself.faces.interrupt import StdioSigintExits, stdin_is_terminal

            if stdin_is_terminal():  # a person, not a client: say what this is (stdout stays JSON-RPC only)
                sys.stderr.write(STDIO_TERMINAL_HINT.format(readme=_readme()) + "\n")
                sys.stderr.flush()
            with StdioSigintExits(lambda: _stop_for_exit(core)):
                run_stdio(mcp)
        else:
            from promptyoself.faces.http_auth import agent_resolver, http_token, proxy_options, transport_middleware

            level = settings.log_level.lower()
            log.info(
                "serving %s on http://%s:%s%s (bearer token %s)",
                transport,
                _url_host(args.host),
                args.port,
                args.path or ("/mcp" if transport == "http" else "/sse"),
                "required" if http_token(settings) else "not required",
            )
            kind: Literal["http", "sse"] = "http" if transport == "http" else "sse"
            mcp.run(
                kind,
                host=args.host,
                port=args.port,
                path=args.path,
                show_banner=False,
                # Host/Origin, JSON writes, body size, the token (and agent tokens)
                middleware=transport_middleware(settings, args.host, agent_resolver(core)),
                # Route uvicorn's logs through our handlers (stderr/file/JSON, redaction): its own
                # default config would print access lines on stdout.
                # X-Forwarded-For only from PROMPTYOSELF_TRUSTED_PROXIES (the wrong-token throttle's key)
                uvicorn_config={"log_config": None, "log_level": level, "access_log": level == "debug",
                                **proxy_options(settings)},
            )
    finally:
        core.close()
    return 0


class PortInUse(Exception):
    """The port cannot be bound; the message says what to do (one line, exit 2)."""


def bind_port(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``, made before anything else starts (the service binds
    before it touches the worker lease, so a second ``serve`` on a taken port changes nothing)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(f"port {port} is in use; pass --port or stop the other service") from None
        if exc.errno == errno.EACCES:
            raise PortInUse(f"port {port} needs privileges this user lacks; pass --port above 1023") from None
        raise PortInUse(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pass another --host "
                        "or --port") from None
    sock.set_inheritable(True)
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


LOOPBACK = ("localhost", "ip6-localhost")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (127.0.0.0/8, ::1); false for all else."""
    import ipaddress

    name = host.strip().strip("[]").lower()
    if name in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


MIN_EXPOSED_TOKEN = 16
"""The shortest ``PROMPTYOSELF_HTTP_TOKEN`` accepted when the service listens beyond loopback."""


def check_exposure(host: str, allow_external: bool, settings: Settings) -> str | None:
    """Why binding ``host`` is refused, or ``None`` when it is allowed."""
    from promptyoself.faces.http_auth import ANY_HOST_NEEDS_TOKEN

    token = settings.http_token.get_secret_value().strip() if settings.http_token else ""
    if settings.allowed_host_names is None and not token:
        return ANY_HOST_NEEDS_TOKEN
    if is_loopback(host):
        return None
    if not allow_external:
        return (
            f"Refusing to bind {host}: only 127.0.0.1 is allowed without --allow-external "
            "(and PROMPTYOSELF_HTTP_TOKEN)."
        )
    if not token:
        return (
            f"Refusing to bind {host} without PROMPTYOSELF_HTTP_TOKEN: anyone on the network could "
            "schedule prompts. Set a token (clients send 'Authorization: Bearer <token>')."
        )
    if len(token) < MIN_EXPOSED_TOKEN:
        return (
            f"Refusing to bind {host} with a PROMPTYOSELF_HTTP_TOKEN of {len(token)} characters: beyond loopback "
            f"it must have at least {MIN_EXPOSED_TOKEN} (e.g. `openssl rand -hex 24`)."
        )
    return None
