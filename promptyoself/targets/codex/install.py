"""``promptyoself codex install``: our stdio MCP server as Codex starts it, the
``[mcp_servers.promptyoself]`` table of ``<codex home>/config.toml`` (printed, or written with
``--write``: the table replaced or appended, the rest of the file kept as it is)."""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from promptyoself.errors import InvalidArgument
from promptyoself.targets.codex.session import codex_home

MCP_NAME = "promptyoself"
_TABLE = re.compile(rf"^\[mcp_servers\.{MCP_NAME}(?:\.[A-Za-z0-9_]+)?\]\s*$")


def entry(settings: Any) -> dict[str, Any]:
    """The server's command, arguments and environment (the database: Codex passes only HOME, PWD, PATH)."""
    script = Path(sys.executable).parent / "promptyoself-mcp"
    command, args = (str(script), []) if script.exists() else (sys.executable, ["-m", "promptyoself", "serve",
                                                                                 "--transport", "stdio"])
    env = {"PROMPTYOSELF_DB": settings.db_url}
    if not settings.executor_autostart:
        env["PROMPTYOSELF_EXECUTOR_AUTOSTART"] = "false"
    return {"command": command, "args": args, "env": env}


def _q(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is a JSON string for these values


def toml_table(settings: Any) -> str:
    e = entry(settings)
    lines = [f"[mcp_servers.{MCP_NAME}]", f"command = {_q(e['command'])}",
             f"args = [{', '.join(_q(a) for a in e['args'])}]",
             "required = true  # Codex waits for it before a session's first turn: the tools are there at once",
             'default_tools_approval_mode = "approve"  # our tools only write schedules: no approval prompt',
             "", f"[mcp_servers.{MCP_NAME}.env]"]
    lines += [f"{k} = {_q(v)}" for k, v in e["env"].items()]
    return "\n".join(lines) + "\n"


def merged(existing: str, table: str) -> str:
    """``existing`` with our tables replaced by ``table`` (appended when absent)."""
    out: list[str] = []
    skipping = False
    for line in existing.splitlines():
        if line.lstrip().startswith("["):
            skipping = bool(_TABLE.match(line.strip()))
        if not skipping:
            out.append(line)
    text = "\n".join(out).rstrip()
    return (text + "\n\n" if text else "") + table


def install(settings: Any, project: object = None, home: object = None, *, write: bool = False) -> dict[str, Any]:
    if project is not None and not isinstance(project, str):
        raise InvalidArgument("--project must be a directory.")
    folder = Path(project or os.getcwd()).expanduser().resolve()
    where = Path(home).expanduser() if isinstance(home, str) and home.strip() else codex_home()
    table = toml_table(settings)
    path = where / "config.toml"
    out: dict[str, Any] = {"status": "success", "config_toml": str(path), "entry": table, "written": None}
    if not write:
        out["message"] = (f"Add this to {path} (or run with --write), then start codex in {folder}: its agent can "
                          "schedule prompts that come back into the same session.\n" + table)
        return out
    if not folder.is_dir():
        raise InvalidArgument(f"{folder} is not a directory.")
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    text = merged(existing, table)
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"{path} is not valid TOML ({exc}); fix it first.") from None
    where.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".toml.promptyoself-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    out["written"] = str(path)
    out["message"] = (f"Added the {MCP_NAME} MCP server to {path}. Start codex in {folder}; its agent can now "
                      "schedule prompts that come back into the same session.")
    return out
