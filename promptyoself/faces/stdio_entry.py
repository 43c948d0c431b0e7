"""Entry points that try the stdio relay (promptyoself.faces.relay) before loading the MCP server:
``promptyoself_mcp_server.py`` and the ``promptyoself-mcp`` script (stdio by default), and
``python -m promptyoself`` / ``promptyoself/cli.py`` / the ``promptyoself`` script for
``serve --transport stdio``.

Only the standard library is imported until the relay has been tried; with a service answering for
the same database nothing else ever is. A Python that lacks the dependencies gets one line on how to
install them (exit 2), not a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path


def mcp_main(argv: list[str] | None = None) -> int:
    """``promptyoself-mcp`` / ``promptyoself_mcp_server.py``: relay, else the in-process server."""
    from promptyoself.faces.relay import is_stdio_args, try_relay

    args = sys.argv[1:] if argv is None else argv
    if is_stdio_args(args, default_stdio=True):
        relayed = try_relay()
        if relayed is not None:
            return relayed
    try:
        from promptyoself.faces.serve import main
    except ModuleNotFoundError as exc:
        return missing_dependency(exc, str(Path(__file__).resolve().parents[2] / "promptyoself_mcp_server.py"), args)
    return main(argv)


def cli_main(argv: list[str] | None = None, *, run_as: str = "-m promptyoself") -> int:
    """``promptyoself`` / ``python -m promptyoself``: ``serve --transport stdio`` relays when it can."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"]:
        from promptyoself.faces.relay import is_stdio_args, try_relay  # the relay's sockets: only when used

        relayed = try_relay() if is_stdio_args(args[1:], default_stdio=False) else None
        if relayed is not None:
            return relayed
    if args[:1] in (["schedule"], ["list"]):  # an agent's call: handed to a running service when there is one
        from promptyoself.faces.cli_relay import run

        handed = run(args)
        if handed is not None:
            return handed
    try:
        from promptyoself.faces.cli import main

        # The CLI parses with the standard library and imports the rest after parsing (issue 32 point 3),
        # so a missing dependency shows up inside main, not at this import.
        return main(argv)
    except ModuleNotFoundError as exc:
        return missing_dependency(exc, run_as, args)


def missing_dependency(exc: ModuleNotFoundError, run_as: str, args: list[str]) -> int:
    """A Python without PromptYoSelf's dependencies: one line on stderr naming what is missing and how
    to run it with them, exit code 2. A missing module of our own is a bug and is raised."""
    if not exc.name or exc.name.split(".")[0] == "promptyoself":
        raise exc
    root = Path(__file__).resolve().parents[2]
    venv = root / ".venv" / "bin" / "python"
    shown = " ".join([run_as, *args])
    if venv.exists() and Path(sys.executable).absolute() != venv.absolute():
        how = f"run it with the checkout's venv: {venv} {shown}"
    else:
        how = (f"install them: cd {root} && python3 -m venv .venv && .venv/bin/pip install -e ., then run "
               f"{venv} {shown}")
    sys.stderr.write(f"promptyoself: this Python ({sys.executable}) lacks the dependency {exc.name!r}; {how} "
                     "(or `pip install -e .` into this Python).\n")
    sys.stderr.flush()
    return 2
