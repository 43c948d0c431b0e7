"""Thin entry point: ``python promptyoself_mcp_server.py [--transport ...]`` runs the MCP server."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from promptyoself.faces.serve import main

if __name__ == "__main__":
    sys.exit(main())
