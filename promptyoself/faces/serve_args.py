"""The flags of ``serve`` (and of ``promptyoself-mcp``), standard library only: the command line builds
its parser, and answers ``--help`` and usage errors, without importing the settings or the server."""

from __future__ import annotations

import argparse

__all__ = ["add_serve_arguments", "port_number"]


def port_number(text: str) -> int:
    """``--port``: a TCP port, 0-65535 (0: any free port); else a usage error (exit 2)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0-65535)")
    return port


def add_serve_arguments(p: argparse.ArgumentParser, *, service: bool = False) -> None:
    if service:  # `promptyoself serve`: without --transport, the long-lived service
        p.add_argument(
            "--transport", choices=("stdio", "http", "sse"), default=None,
            help="only the MCP server on this transport (default: the service: delivery + /mcp, /healthz, "
            "/metrics on one HTTP port)",
        )
    else:
        p.add_argument(
            "--transport", choices=("stdio", "http", "sse"), default="stdio", help="MCP transport (default stdio)"
        )
    p.add_argument("--host", default="127.0.0.1", help="bind address for http/sse/the service (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8000, help="port for http/sse/the service (default 8000)")
    p.add_argument("--path", default=None, help="MCP endpoint path (default /mcp for http, /sse for sse)")
    p.add_argument(
        "--allow-external", action="store_true", help="allow a non-loopback --host (needs PROMPTYOSELF_HTTP_TOKEN)"
    )
    p.add_argument(
        "--no-executor",
        action="store_true",
        help="deliver nothing from this process (same as PROMPTYOSELF_EXECUTOR_AUTOSTART=false)",
    )
