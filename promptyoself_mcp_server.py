"""Thin entry point: ``python promptyoself_mcp_server.py [--transport ...]`` runs the MCP server.

On stdio, when a service runs for the same database, the process only relays its stdin and stdout
to it (promptyoself.faces.relay: standard library only); otherwise it runs the server in-process.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    from promptyoself.faces.relay import is_stdio_args, try_relay

    if is_stdio_args(sys.argv[1:], default_stdio=True):
        relayed = try_relay()
        if relayed is not None:
            sys.exit(relayed)

from promptyoself.faces.mcp import main

if __name__ == "__main__":
    sys.exit(main())
