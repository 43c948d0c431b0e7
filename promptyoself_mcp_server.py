"""Thin entry point: ``python promptyoself_mcp_server.py [--transport ...]`` runs the MCP server.

On stdio, when a service runs for the same database, the process only relays its stdin and stdout
to it (promptyoself.faces.relay: standard library only); otherwise it runs the server in-process.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    from promptyoself.faces.stdio_entry import mcp_main
except KeyboardInterrupt:  # Ctrl-C while it starts: exit code 130, no traceback
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(mcp_main())
