"""``promptyoself schedule`` and ``list`` handed to the running service (issue 32 point 3).

An agent's Bash tool runs ``promptyoself schedule ...`` once per call; importing the settings, the
store and the core costs most of a second. When ``promptyoself serve`` runs for the same database it
already listens on the stdio relay's socket (``promptyoself.faces.relay``), so this module, with the
standard library only, parses the command with the CLI's own parser (``--help`` and usage errors are
answered right there, as the CLI answers them, exit 0 or 2), opens a relay session (the same
handshake: this process's PROMPTYOSELF_* / LETTA_* settings, checked by the service), and makes the
one MCP tool call the command stands for (``promptyoself_schedule_time|cron|every``,
``promptyoself_list``). The answer is printed as the CLI prints it: the same JSON, errors in the CLI's
words with the CLI's exit codes.

A schedule whose destination is found from this process (an agent CLI's session: its environment
and parent processes, which the service does not see) is handed over too, with that destination sent
as explicit options; ``promptyoself.targets.relay_arguments`` decides. Anything else falls back to the
in-process command, with nothing sent: no service or socket, a refused handshake, a terminal (tables
need the full program), a target the relay cannot judge alike (an outside plug-in, one whose settings
come from this process's environment), a session that cannot be found (the in-process command says
what to pass), or ``PROMPTYOSELF_STDIO_RELAY=off``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

from promptyoself.faces import relay

COMMANDS = ("schedule", "list")
TIMEOUT = 60.0  # a schedule checks the agent on Letta (PROMPTYOSELF_LETTA_TIMEOUT): give it time
SCHEDULE_ARGS = ("agent_id", "timezone", "skip_validation", "idempotency_key", "target", "conversation_id",
                 "catch_up", "max_per_day", "overlap")


def tool_call(args: Any, values: dict[str, str] | None = None) -> tuple[str, dict[str, Any]] | None:
    """The MCP tool and arguments for parsed CLI arguments (``values``: this process's settings), or None
    when this command stays in process."""
    if args.command == "list":
        return "promptyoself_list", {"agent_id": args.agent_id, "include_cancelled": args.include_cancelled,
                                     "limit": args.limit, "offset": args.offset}
    if args.command != "schedule":
        return None
    where = destination(args, agent_token=bool((values or {}).get("PROMPTYOSELF_AGENT_TOKEN", "").strip()))
    if where is None:
        return None
    common = {name: getattr(args, name) for name in SCHEDULE_ARGS if getattr(args, name, None) is not None}
    common.update(where, prompt=args.prompt)
    if args.time is not None or args.cron is not None:
        if args.start_at or args.max_repetitions is not None:
            return None  # the in-process command words this usage error
        kind = "time" if args.time is not None else "cron"
        return f"promptyoself_schedule_{kind}", {**common, kind: getattr(args, kind)}
    extra = {k: v for k, v in (("start_at", args.start_at), ("max_repetitions", args.max_repetitions)) if v is not None}
    return "promptyoself_schedule_every", {**common, "every": args.every, **extra}


def destination(args: Any, *, agent_token: bool = False) -> dict[str, str] | None:
    """The target arguments that make the service judge a schedule's destination as this process
    would, or None when it stays in process (``promptyoself.targets.relay_arguments``)."""
    from promptyoself.targets import relay_arguments

    return relay_arguments(args, agent_token=agent_token)


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode("utf-8") + b"\n")


def _answer(sock: socket.socket, buffer: bytearray, want: int) -> dict[str, Any]:
    """The JSON-RPC response with id ``want`` (notifications and logs before it are skipped)."""
    while True:
        while b"\n" not in buffer:
            part = sock.recv(65536)
            if not part:
                raise OSError("the service closed the session")
            buffer += part
        line, _, rest = bytes(buffer).partition(b"\n")
        buffer[:] = rest
        if not line.strip():
            continue
        message = json.loads(line)
        if isinstance(message, dict) and message.get("id") == want:
            return message


def call(sock: socket.socket, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One MCP session over the relay socket: initialize, the tool call; the tool's JSON result
    (``{"status": "error", ...}`` for a tool error)."""
    buffer = bytearray()
    _send(sock, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "promptyoself-cli", "version": "1"}}})
    init = _answer(sock, buffer, 1)
    if "error" in init:
        raise OSError("the service refused the MCP session")
    _send(sock, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    _send(sock, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": arguments}})
    reply = _answer(sock, buffer, 2)
    result = reply.get("result")
    if not isinstance(result, dict):
        raise OSError("the service answered no result")
    if isinstance(result.get("structuredContent"), dict) and not result.get("isError"):
        return dict(result["structuredContent"])
    texts = [c.get("text") for c in result.get("content") or [] if isinstance(c, dict)]
    try:
        parsed = json.loads(texts[0]) if texts and texts[0] else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    raise OSError("the service's answer is not PromptYoSelf's JSON")


def run(argv: list[str]) -> int | None:
    """The exit code of ``argv`` run by the service, or None to run it in this process."""
    if not argv or argv[0] not in COMMANDS:
        return None
    from promptyoself.faces import cli

    try:
        args = cli.cli_parser().parse_args(argv)
    except SystemExit as exc:  # --help or a usage error, said by the CLI's own parser: done (no settings read)
        return int(exc.code or 0)
    if os.name != "posix":
        return None
    if not getattr(args, "json", False) and sys.stdout.isatty():
        return None  # a table: the in-process command draws it
    values = relay.visible_settings()
    if not relay.relay_enabled(values):
        return None
    planned = tool_call(args, values)
    if planned is None:
        return None
    try:
        sock = relay.connect(values)
    except Exception:
        return None
    if sock is None:
        return None
    relay.dump_loaded_modules()
    try:
        sock.settimeout(TIMEOUT)
        result = call(sock, *planned)
    except (OSError, ValueError):
        # Nothing is known to have been stored only when the call was never answered; a schedule
        # with no answer is not retried here (it may exist): say so, as the in-process command would.
        if args.command == "schedule":
            result = {"status": "error", "code": "internal",
                      "error": "The running service did not answer this schedule; run `promptyoself list` to see "
                               "whether it was made."}
        else:
            return None
    finally:
        sock.close()
    return _print(args, result)


def _print(args: Any, result: dict[str, Any]) -> int:
    if result.get("status") == "error":
        from promptyoself.faces.cli_errors import cli_message

        result = {**result, "error": cli_message(str(result.get("error", "")))}
        unchecked = ("letta_unavailable", "letta_auth", "target_unavailable", "target_auth")  # as faces/cli.py's
        if (args.command == "schedule" and result.get("code") in unchecked
                and not args.skip_validation):
            result["error"] += (" The agent is checked on Letta before it is scheduled: add --skip-validation to "
                                "schedule without that check (delivery still needs Letta when it is due).")
    elif args.command == "schedule" and result.get("state", "active") == "active":
        result["delivery"] = "The service running for this database delivers it."
    sys.stdout.write(json.dumps(result, default=str, indent=2 if sys.stdout.isatty() else None) + "\n")
    sys.stdout.flush()
    return 1 if result.get("status") == "error" else 0
