"""Thin entry point: ``python promptyoself_mcp_server.py [--transport ...]`` runs the MCP server."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    from promptyoself.faces.serve import main
except KeyboardInterrupt:  # Ctrl-C while it starts: exit code 130, no traceback
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
