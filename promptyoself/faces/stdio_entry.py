"""Entry points that try the stdio relay (promptyoself.faces.relay) before loading the MCP server:
``promptyoself_mcp_server.py`` and the ``promptyoself-mcp`` script (stdio by default), and
``python -m promptyoself`` / the ``promptyoself`` script for ``serve --transport stdio``.

Only the standard library is imported until the relay has been tried; with a service answering for
the same database nothing else ever is.
"""

from __future__ import annotations

import sys

from promptyoself.faces.relay import is_stdio_args, try_relay


def mcp_main(argv: list[str] | None = None) -> int:
    """``promptyoself-mcp`` / ``promptyoself_mcp_server.py``: relay, else the in-process server."""
    args = sys.argv[1:] if argv is None else argv
    if is_stdio_args(args, default_stdio=True):
        relayed = try_relay()
        if relayed is not None:
            return relayed
    from promptyoself.faces.serve import main

    return main(argv)


def cli_main(argv: list[str] | None = None) -> int:
    """``promptyoself`` / ``python -m promptyoself``: ``serve --transport stdio`` relays when it can."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"] and is_stdio_args(args[1:], default_stdio=False):
        relayed = try_relay()
        if relayed is not None:
            return relayed
    from promptyoself.faces.cli import main

    return main(argv)
