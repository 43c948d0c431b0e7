"""The floor for start-up figures: a minimal FastMCP server with one tool, run over stdio.

It starts the way a careful FastMCP program should (docs/design.md §3): update check and banner off.
"""

import os

os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")
os.environ.setdefault("FASTMCP_SHOW_SERVER_BANNER", "false")

from fastmcp import FastMCP

mcp = FastMCP("baseline")


@mcp.tool
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


if __name__ == "__main__":
    mcp.run("stdio", show_banner=False)
