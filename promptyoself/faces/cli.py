"""``python -m promptyoself``: the command line. Each subcommand calls the core and prints its result.

JSON on stdout when stdout is not a terminal (or with ``--json``), a readable table on a terminal.
Exit codes: 0 success, 1 the operation failed, 2 usage error. Logs go to stderr, never stdout.
``promptyoself/cli.py`` is the entry script a plugin host runs as a file (``python promptyoself/cli.py --help``).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from promptyoself.faces.serve_args import add_serve_arguments
from promptyoself.limits import MAX_LIMIT, MAX_MAX_REPETITIONS, MAX_PER_DAY

T = TypeVar("T")

if TYPE_CHECKING:  # logging and zoneinfo are imported where used: --help and a relayed call need neither
    from zoneinfo import ZoneInfo

    from promptyoself.core.operations import Core

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad command-line input found after argparse (exit code 2)."""


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0 (no 'nan', 'inf', 0 or negatives)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text[:40]!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text[:40]!r}")
    return value


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """argparse type: a whole number from ``low`` to ``high``, so that ``--limit 0`` is a usage error
    (exit 2) like ``--limit abc``, not a failed operation."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text[:40]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {value}")
        return value

    parse.__name__ = "whole number"  # argparse names the type in its message
    return parse


UNCHECKED_CODES = ("letta_unavailable", "letta_auth", "target_unavailable", "target_auth")
"""A schedule refused because its agent could not be checked where its prompts go: --skip-validation helps."""
Run = Callable[[Any, argparse.Namespace], dict[str, Any] | None]
"""A command: ``run(core, args)``, whose dict is printed as the result."""


def _version() -> str:
    from promptyoself import __version__

    return __version__


def _add_agent(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent-id", help="Letta agent id (default: inferred from env / defaults)")


def _add_json(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: a subcommand's default must not undo `promptyoself --json CMD`.
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON even on a terminal")


def _target_option(text: str) -> tuple[str, Any]:
    """argparse type of ``--target-option KEY=VALUE``: the value as JSON when it parses, else the text."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text[:40]!r}")
    try:
        parsed: Any = json.loads(value)
    except ValueError:
        parsed = value
    return key.strip(), parsed


class _TargetsHelp(argparse.HelpFormatter):
    """``schedule --help`` names the installed targets (read from the registry only when help is shown:
    parsing a command needs the standard library only)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text and "{targets}" in text:
            from promptyoself.targets import registry

            text = text.replace("{targets}", ", ".join(registry.names()))
        return text


def _add_plain(sub: Any, commands: dict[str, str], *, schedule_id: bool = False) -> None:
    """Subcommands that take nothing but ``--json`` (and a schedule id where ``schedule_id``)."""
    for name, text in commands.items():
        p = sub.add_parser(name, help=text)
        if schedule_id:
            p.add_argument("id", help="schedule id")
        _add_json(p)


@functools.cache
def cli_parser() -> argparse.ArgumentParser:
    """The parser, built once a process: the relay's attempt (faces/cli_relay.py) and ``main`` parse
    with the same one (building it is ~60 parsers and ~10 ms of a CLI call)."""
    return build_parser()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="promptyoself",
        usage="%(prog)s [-h] [--json] COMMAND ...",
        description="Schedule prompts for AI agents (Letta agents, agent CLI sessions, HTTP receivers: every "
                    "installed target, `promptyoself targets`) and deliver them on time, exactly once.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON even on a terminal")
    parser.add_argument("--version", action="version", version=f"promptyoself {_version()}")
    # help=SUPPRESS: the commands are listed once, in the epilog's "Available commands:" block.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS, prog="promptyoself")

    p = sub.add_parser("schedule", help="schedule a prompt (--time, --cron or --every)")
    p.add_argument("--prompt", required=True, help="text the agent will receive")
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--time", help="once: 'tomorrow at 9am', 'monday 9:00', 'in 2 hours', ISO 8601, ...")
    when.add_argument("--cron", help="recurring: 'every weekday at 9', an RFC 5545 RRULE, or cron '0 9 * * MON-FRI'")
    when.add_argument("--every", help="recurring: interval, e.g. '30m', '1h30m', 'PT15M'")
    _add_agent(p)
    p.add_argument("--timezone", help="IANA timezone, e.g. Europe/Berlin")
    p.add_argument("--start-at", help="with --every: first run")
    p.add_argument("--max-repetitions", type=whole_number(1, MAX_MAX_REPETITIONS),
                   help="with --every: stop after N deliveries")
    p.add_argument("--skip-validation", action="store_true", help="do not check the agent on Letta")
    p.add_argument("--idempotency-key", help="retry-safe key; repeats return the first schedule")
    p.add_argument("--target", metavar="NAME",
                   help="where it is delivered: an installed target ({targets}); default: the one that claims the "
                        "call (the agent CLI session it runs in, the server that holds the agent), else letta")
    p.add_argument("--target-option", metavar="KEY=VALUE", action="append", type=_target_option,
                   help="one of the target's own options (repeatable; a value that parses as JSON is read as JSON); "
                        "`promptyoself targets` lists each target's")
    p.add_argument("--conversation-id", help="alias of --target-option conversation_id=...")
    p.add_argument("--endpoint", help="alias of --target-option endpoint=... (a configured endpoint)")
    p.add_argument("--session-id", help="alias of --target-option session_id=... (default: this session)")
    p.add_argument("--cwd", help="alias of --target-option cwd=... (the session's working directory)")
    p.formatter_class = _TargetsHelp
    p.add_argument("--catch-up", choices=("skip", "latest", "all"), default=None,
                   help="missed runs: latest (default: one run for them), skip, or all (at most 10)")
    p.add_argument("--max-per-day", type=whole_number(1, MAX_PER_DAY),
                   help="deliver at most N a day; more are recorded over_budget")
    p.add_argument("--overlap", choices=("skip", "queue", "allow"), default=None,
                   help="a run due while the previous turn still runs: skip, queue (waits, at most one) or allow "
                        "(default: the target's, see `promptyoself targets`)")
    _add_json(p)

    p = sub.add_parser("list", help="list schedules")
    _add_agent(p)
    p.add_argument("--include-cancelled", action="store_true", help="also ended schedules")
    p.add_argument("--limit", type=whole_number(1, MAX_LIMIT), default=50,
                   help=f"page size (default 50, at most {MAX_LIMIT})")
    p.add_argument("--offset", type=whole_number(0, 10**9), default=0, help="rows to skip")
    _add_json(p)

    _add_plain(sub, {"cancel": "cancel a schedule", "pause": "pause a schedule",
                     "resume": "resume a paused schedule",
                     "approve": "approve a schedule waiting in pending_approval",
                     "reject": "reject (cancel) a schedule waiting in pending_approval"}, schedule_id=True)

    p = sub.add_parser("overlap", help="change a schedule's overlap policy (skip, queue or allow)")
    p.add_argument("id", help="schedule id")
    p.add_argument("policy", choices=("skip", "queue", "allow"),
                   help="a run due while the previous turn still runs: skip, queue (waits, at most one) or allow")
    _add_json(p)

    p = sub.add_parser("history", help="delivery attempts, newest first")
    p.add_argument("--schedule-id", help="only this schedule")
    _add_agent(p)
    p.add_argument("--limit", type=whole_number(1, MAX_LIMIT), default=20,
                   help=f"rows (default 20, at most {MAX_LIMIT})")
    _add_json(p)

    p = sub.add_parser("execute", help="deliver due prompts now (or --loop)")
    p.add_argument("--loop", action="store_true", help="keep delivering until interrupted")
    p.add_argument("--interval", type=positive_seconds, default=None, help="seconds between re-reads")
    _add_json(p)

    p = sub.add_parser("worker", help="run (or inspect/stop) the delivery worker")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--status", action="store_true", help="show the worker lease and exit")
    group.add_argument("--stop", action="store_true", help="stop the running worker")
    group.add_argument("--start", action="store_true",
                       help="start a detached worker unless a live one holds the lease, and exit")
    p.add_argument("--shared", action="store_true", help="skip the singleton lease (several workers on PostgreSQL)")
    _add_json(p)

    _add_plain(sub, {"test": "check the Letta connection", "agents": "list Letta agents",
                     "health": "show server health",
                     "targets": "the installed delivery targets, their options and whether each is ready"})

    p = sub.add_parser("upload", help="upload a Python function to Letta as a tool")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", help="path of the .py file holding the function")
    src.add_argument("--source-code", help="the source itself")
    p.add_argument("--name", help="function name (must match the source)")
    p.add_argument("--description", help="tool description")
    _add_json(p)

    p = sub.add_parser("serve", help="run the service (delivery + HTTP), or the MCP server with --transport")
    add_serve_arguments(p, service=True)

    p = sub.add_parser("service", help="install, remove or inspect the supervised service (systemd/launchd)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in (("install", "write the unit (and enable + start it where systemd runs)"),
                       ("uninstall", "stop, disable and remove the unit"),
                       ("status", "the unit's state and the worker lease")):
        a = actions.add_parser(name, help=text)
        a.add_argument("--system", action="store_true", help="a system unit (default: a user unit)")
        a.add_argument("--kind", choices=("systemd", "launchd"), default=None,
                       help="supervisor (default: launchd on macOS, else systemd)")
        if name == "install":
            a.add_argument("--print", action="store_true", help="only print the unit (and settings file)")
            a.add_argument("--host", default="127.0.0.1", help="service bind address (default 127.0.0.1)")
            a.add_argument("--port", type=whole_number(1, 65535), default=8000, help="service port (default 8000)")
        _add_json(a)

    p = sub.add_parser("letta", help="native Letta tools: install-tools / uninstall-tools")
    lsub = p.add_subparsers(dest="letta_command", metavar="ACTION", required=True)
    for name, text in (("install-tools", "upload the tools and attach them to agents"),
                       ("uninstall-tools", "detach the tools (and delete them with --all-agents)")):
        lp = lsub.add_parser(name, help=text)
        who = lp.add_mutually_exclusive_group(required=True)
        who.add_argument("--agent-id", action="append", dest="agent_ids", help="agent id (repeatable)")
        who.add_argument("--all-agents", action="store_true", help="every agent on the Letta server")
        if name == "install-tools":
            lp.add_argument("--service-url", default="http://127.0.0.1:8000",
                            help="PromptYoSelf's REST URL as Letta's tool sandbox reaches it (default http://127.0.0.1:8000)")
            lp.add_argument("--skip-check", action="store_true",
                            help="do not check the service URL first (when only Letta's sandbox reaches it)")
        _add_json(lp)

    p = sub.add_parser("token", help="the operator token (show, rotate) and agent tokens (mint, list, revoke, rotate)")
    tsub = p.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    tp = tsub.add_parser("show", help="the operator token, where it comes from, and what the running service uses")
    _add_json(tp)
    tp = tsub.add_parser("rotate", help="a new operator token in the token file; with --agent-id, new agent tokens")
    tp.add_argument("--agent-id", action="append", dest="agent_ids",
                    help="rotate this agent's token instead (repeatable); its earlier tokens are revoked")
    tp.add_argument("--service-url", default=None,
                    help="with --agent-id: also give the new token to the agent's native tools on Letta")
    _add_json(tp)
    tp = tsub.add_parser("mint", help="a new agent token (that agent's own schedules only), shown once")
    tp.add_argument("--agent-id", required=True, help="the agent it acts for")
    _add_json(tp)
    tp = tsub.add_parser("list", help="agent tokens (never the tokens themselves: their first characters)")
    tp.add_argument("--agent-id", help="only this agent's")
    tp.add_argument("--include-revoked", action="store_true", help="also revoked ones")
    _add_json(tp)
    tp = tsub.add_parser("revoke", help="revoke an agent's tokens (or one by --id): refused from now on")
    who = tp.add_mutually_exclusive_group(required=True)
    who.add_argument("--agent-id", help="every live token of this agent")
    who.add_argument("--id", type=whole_number(1, 2**31), help="one token, by the id `token list` shows")
    _add_json(tp)

    p = sub.add_parser("policy", help="the guardrails every writer enforces: show, or set (operator)")
    psub = p.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    pp = psub.add_parser("show", help="each value and where it came from (database, environment seed, default)")
    _add_json(pp)
    pp = psub.add_parser("set", help="set values: NAME=VALUE ... (e.g. approval_below=30m max_active_per_agent=50)")
    pp.add_argument("values", nargs="+", metavar="NAME=VALUE",
                    help="max_deliveries_per_agent_per_day, max_schedules_per_agent_per_hour, approval_below "
                         "(a duration or off), max_active_per_agent, pause_after_failures, "
                         "max_tokens_per_agent_per_day, max_cost_usd_per_agent_per_day (USD, e.g. 2.50)")
    _add_json(pp)

    p = sub.add_parser("purge", help="delete ended schedules and old history now (retention; operator)")
    p.add_argument("--before", metavar="WHEN", default=None,
                   help="what ended or was attempted before this: a duration ago (30d, 12h) or an ISO date "
                        "(default: PROMPTYOSELF_KEEP_ENDED and PROMPTYOSELF_KEEP_HISTORY)")
    _add_json(p)

    p = sub.add_parser("import-legacy", help="import schedules from an earlier PromptYoSelf database")
    p.add_argument("path", help="path of the legacy SQLite file (table unified_reminders)")
    _add_json(p)
    _plugin_epilog(parser, sub)
    return parser


def _plugin_epilog(parser: argparse.ArgumentParser, sub: Any) -> None:
    """The 'Available commands:' block a Sanctum-style plugin host reads from ``--help`` to discover
    commands (one per line, two-space indent, the name first; a blank line ends it)."""
    rows = [(a.dest, a.help or "") for a in sub._choices_actions]
    width = max(len(name) for name, _ in rows) + 2
    lines = ["Available commands:", *(f"  {name.ljust(width)}{text}" for name, text in rows), ""]
    lines += ["`promptyoself COMMAND --help` shows a command's flags.",
              "Output: JSON on stdout when it is not a terminal (or with --json), else a table.",
              "Exit codes: 0 success, 1 the operation failed, 2 usage error."]
    parser.epilog = "\n".join(lines)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


# ---- output -----------------------------------------------------------------------------------

def emit(result: dict[str, Any], as_json: bool, zone: ZoneInfo | None = None) -> None:
    """JSON (one line when piped, indented on a terminal), or for a terminal the text of
    ``promptyoself.faces.tables`` with instants in each schedule's timezone (``zone``,
    ``PROMPTYOSELF_TIMEZONE``, for the rest)."""
    if as_json:
        text = json.dumps(result, default=str, indent=2 if sys.stdout.isatty() else None)
    else:
        from promptyoself.faces import tables

        text = tables.render(result, zone)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _zone(core: Core) -> ZoneInfo | None:
    """``PROMPTYOSELF_TIMEZONE``: where a terminal shows instants that belong to no schedule."""
    try:
        from zoneinfo import ZoneInfo

        return ZoneInfo(str(core.settings.timezone))
    except Exception:  # a test double without settings, or a zone this machine lacks: UTC
        return None


def want_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False)) or not sys.stdout.isatty()


# ---- commands ---------------------------------------------------------------------------------


def awaited(call: Coroutine[Any, Any, T]) -> T:
    """A command's one call into the core's async operations, run to its end (``asyncio.run``, imported
    here: ``--help`` and usage errors stay on the parser's imports)."""
    import asyncio

    return asyncio.run(call)


def _schedule(core: Core, a: argparse.Namespace) -> dict[str, Any]:
    return _with_delivery(core, _schedule_only(core, a))


def _with_delivery(core: Core, result: dict[str, Any]) -> dict[str, Any]:
    """``schedule`` and ``resume`` make a schedule active: make sure something delivers it."""
    if result.get("status") == "success" and result.get("state", "active") == "active":
        result["delivery"] = ensure_delivery(core)
    return result


def ensure_delivery(core: Core) -> str:
    """After a write: who delivers it (``promptyoself.delivery.starter``; the write itself already ran
    the check, which started a worker if none was live). Never fails the write."""
    from promptyoself.delivery.starter import starter_for

    starter = starter_for(core)
    found = starter.last if starter.last is not None else starter.ensure()
    return found.message


def _schedule_only(core: Core, a: argparse.Namespace) -> dict[str, Any]:
    from promptyoself.core.options import OPTION_NAMES, ScheduleOptions

    if a.every is None and (a.start_at or a.max_repetitions is not None):
        raise UsageError("--start-at and --max-repetitions go with --every")
    # each option's flag is its name with dashes (--agent-id, --max-per-day, ...): argparse's dest is the name
    values: dict[str, Any] = {name: getattr(a, name) for name in OPTION_NAMES if name != "target_options"}
    if a.target_option:
        values["target_options"] = dict(a.target_option)
    options = ScheduleOptions.of(values)
    scheduling = core.scheduling
    if a.time is not None:
        return dict(awaited(scheduling.schedule_time(a.prompt, a.time, options)))
    if a.cron is not None:
        return dict(awaited(scheduling.schedule_cron(a.prompt, a.cron, options)))
    return dict(awaited(scheduling.schedule_every(a.prompt, a.every, options, start_at=a.start_at,
                                                  max_repetitions=a.max_repetitions)))


def _health(core: Core) -> dict[str, Any]:
    """Health without what describes only this short-lived process (its uptime, its MCP tool calls)."""
    result = dict(awaited(core.health()))
    for key in ("uptime_s", "tool_calls"):
        result.pop(key, None)
    return result


def _upload(core: Core, a: argparse.Namespace) -> dict[str, Any]:
    if a.file:
        from promptyoself.core.checks import MAX_SOURCE_CHARS

        shown = a.file if len(a.file) <= 200 else a.file[:200] + "..."
        limit = 4 * MAX_SOURCE_CHARS  # UTF-8 takes at most 4 bytes a character
        try:  # at most limit + 1 bytes: /dev/zero or a huge file is refused, not read whole
            with open(a.file, "rb") as fh:
                raw = fh.read(limit + 1)
            if len(raw) > limit:
                raise UsageError(f"{shown!r} is over {limit} bytes; a tool's source is at most "
                                 f"{MAX_SOURCE_CHARS} characters")
            source = raw.decode("utf-8")
        except (OSError, ValueError) as exc:  # ValueError: NUL in the path, or not UTF-8 text
            reason = exc.strerror if isinstance(exc, OSError) else type(exc).__name__
            raise UsageError(f"cannot read {shown!r}: {reason}") from None
    else:
        source = a.source_code
    return dict(core.agents.upload_tool(source, name=a.name, description=a.description))


def _execute(core: Core, a: argparse.Namespace) -> dict[str, Any]:
    from promptyoself.faces import delivery

    return dict(delivery.execute_cli(core, loop=a.loop, interval=a.interval))


def _worker(core: Core, a: argparse.Namespace) -> dict[str, Any] | None:
    if a.start:
        from promptyoself.delivery.starter import starter_for

        found = starter_for(core).ensure()
        return {"status": "success" if found.by != "failed" else "error", "delivering": found.by,
                "pid": found.pid, "message": found.message,
                **({"code": "internal", "error": found.message} if found.by == "failed" else {})}
    from promptyoself.faces import delivery

    return delivery.worker_cli(core, status=a.status, stop=a.stop, shared=a.shared)


def _service(core: Core, a: argparse.Namespace) -> dict[str, Any] | None:
    from promptyoself.core import supervise

    kw: dict[str, Any] = {"host": a.host, "port": a.port, "mask": a.print} if a.action == "install" else {}
    plan = supervise.plan(core.settings.db_url, system=a.system, kind=a.kind, **kw)
    if a.action == "install" and a.print:
        text = f"# {plan.unit_path}\n{plan.unit_text}"
        if plan.env_path is not None:
            text += f"\n# {plan.env_path} (mode 0600; secrets shown as ***)\n{plan.env_text}"
        sys.stdout.write(text)
        sys.stdout.flush()
        return None
    if a.action == "install":
        return supervise.install(plan)
    if a.action == "uninstall":
        return supervise.uninstall(plan)
    return supervise.status(core, plan)


def _letta(core: Core, a: argparse.Namespace) -> dict[str, Any]:
    from promptyoself.core import native_tools

    if a.letta_command == "install-tools":
        return dict(native_tools.install(core, agent_ids=a.agent_ids, all_agents=a.all_agents,
                                         service_url=a.service_url, check=not a.skip_check))
    return dict(native_tools.uninstall(core, agent_ids=a.agent_ids, all_agents=a.all_agents))


def _token(core: Core, a: argparse.Namespace) -> dict[str, Any]:
    from promptyoself.core import agent_tokens, native_tools

    command = a.token_command
    if command == "show":
        return dict(native_tools.show_token(core))
    if command == "rotate":
        if a.agent_ids:
            return native_tools.rotate_agent_tokens(core, a.agent_ids, a.service_url)
        if a.service_url:
            raise UsageError("--service-url goes with --agent-id (it hands the new agent token to the agent's tools)")
        return dict(native_tools.rotate_token(core))
    if command == "mint":
        return awaited(agent_tokens.mint(core, a.agent_id))
    if command == "list":
        return awaited(agent_tokens.listing(core, a.agent_id, include_revoked=a.include_revoked))
    return awaited(agent_tokens.revoke(core, agent_id=a.agent_id, token_id=a.id))


def _purge(core: Core, a: argparse.Namespace) -> dict[str, Any]:
    from promptyoself.core.retention import purge

    return awaited(purge(core, before=a.before))


def _policy(core: Core, a: argparse.Namespace) -> dict[str, Any]:
    if a.policy_command == "show":
        return dict(awaited(core.operator.policy_show()))
    changes: dict[str, str] = {}
    for item in a.values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"write each value as NAME=VALUE, e.g. approval_below=30m (got {item[:60]!r})")
        changes[name.strip()] = value
    return dict(awaited(core.operator.policy_set(changes)))


def _import_legacy(core: Core, a: argparse.Namespace) -> dict[str, Any]:
    from promptyoself.core import legacy
    from promptyoself.faces.progress import progress_bar

    with progress_bar("Importing legacy rows") as update:  # drawn on stderr only when it is a terminal
        return dict(legacy.import_legacy(core, a.path, progress=update))


COMMANDS: dict[str, Run] = {
    "schedule": _schedule,
    "list": lambda c, a: dict(awaited(c.scheduling.list_schedules(
        agent_id=a.agent_id, include_cancelled=a.include_cancelled, limit=a.limit, offset=a.offset))),
    "cancel": lambda c, a: dict(awaited(c.scheduling.cancel(a.id))),
    "pause": lambda c, a: dict(awaited(c.scheduling.pause(a.id))),
    "resume": lambda c, a: _with_delivery(c, dict(awaited(c.scheduling.resume(a.id)))),
    "approve": lambda c, a: _with_delivery(c, dict(awaited(c.operator.approve(a.id)))),
    "reject": lambda c, a: dict(awaited(c.operator.reject(a.id))),
    "overlap": lambda c, a: dict(awaited(c.scheduling.set_overlap(a.id, a.policy))),
    "history": lambda c, a: dict(awaited(c.scheduling.history(schedule_id=a.schedule_id, agent_id=a.agent_id,
                                                              limit=a.limit))),
    "execute": _execute,
    "worker": _worker,
    "test": lambda c, a: dict(c.agents.test_connection()),
    "agents": lambda c, a: dict(c.agents.list_agents()),
    "health": lambda c, a: _health(c),
    "targets": lambda c, a: dict(awaited(c.targets())),
    "upload": _upload,
    "import-legacy": _import_legacy,
    "service": _service,
    "letta": _letta,
    "token": _token,
    "policy": _policy,
    "purge": _purge,
}


LONG_RUNNING = frozenset({"serve", "worker"})
"""Commands that keep running: their INFO lines (started, stopped, ...) are the point. The others
are one call each: at the default level their stderr carries warnings and errors only."""


def quiet_stderr(settings: Any, command: str) -> None:
    """``execute``, ``schedule`` and the other one-shot commands print no INFO lines on stderr unless
    ``PROMPTYOSELF_LOG_LEVEL`` asks for them (a log file still gets them)."""
    if command in LONG_RUNNING or "log_level" in settings.model_fields_set:
        return
    import logging

    from promptyoself.logs import StderrHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, StderrHandler) or type(handler) is logging.StreamHandler:
            handler.setLevel(max(handler.level, logging.WARNING))


WORKER_NOTICE = (
    "promptyoself: started a delivery worker in the background (pid {pid}) for this database: it sends your "
    "schedules when they are due and keeps running while future schedules exist (log: {log}). "
    "`promptyoself worker --stop` stops it; `promptyoself service install` makes delivery survive reboots. "
    "(Said once.)\n")


def announce_worker(core: Core) -> None:
    """The first time a command of this database starts a detached worker, say so on stderr, once
    (a marker beside the worker log remembers it). Never fails the command."""
    try:
        from promptyoself.delivery.starter import starter_for, worker_log_path

        last = starter_for(core).last
        if last is None or last.by != "started":
            return
        log_path = worker_log_path(core.settings)
        marker = log_path.with_name(log_path.name + ".announced")
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        sys.stderr.write(WORKER_NOTICE.format(pid=last.pid, log=log_path))
        sys.stderr.flush()
    except Exception:  # a notice only
        import logging

        logging.getLogger(__name__).debug("worker notice failed", exc_info=True)


AGENT_COMMANDS = frozenset({"schedule", "list", "history", "cancel", "pause", "resume", "overlap", "health"})
"""What a CLI started with ``PROMPTYOSELF_AGENT_TOKEN`` may run (for the token's agent only)."""


def scope_to_agent(core: Core, args: argparse.Namespace) -> None:
    """With ``PROMPTYOSELF_AGENT_TOKEN`` set, the command acts for that token's agent only: another
    agent named, or an operator command (approve, reject, token, policy, ...), is ``forbidden``;
    another agent's schedule id is ``not_found``; a revoked token is ``unauthorized``."""
    secret = getattr(core.settings, "agent_token", None)
    token = secret.get_secret_value().strip() if secret is not None else ""
    if not token:
        return
    from promptyoself.core import agent_tokens
    from promptyoself.errors import Unauthorized

    agent = awaited(agent_tokens.resolve(core, token))
    if agent is None:
        raise Unauthorized("PROMPTYOSELF_AGENT_TOKEN is not a live agent token (revoked or unknown): ask the "
                           "operator for a new one (`promptyoself token rotate --agent-id ID`).")
    if args.command not in AGENT_COMMANDS:
        agent_tokens.operator_only(agent, f"`promptyoself {args.command}`")
    if hasattr(args, "agent_id"):
        args.agent_id = agent_tokens.own_agent(agent, args.agent_id)
    if args.command in ("cancel", "pause", "resume", "overlap"):
        awaited(agent_tokens.own_schedule(core, agent, args.id))
    if args.command == "history" and args.schedule_id:
        awaited(agent_tokens.own_schedule(core, agent, args.schedule_id))


def _target_command(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, Run] | None:
    """``promptyoself NAME ...`` where NAME is an installed target with commands of its own (its
    plug-in's ``cli``: installers such as ``promptyoself NAME install``): the arguments parsed by
    the plug-in's parser and its ``run``. None for any other command (the registry is read only when the
    first word is none of ours)."""
    words = [w for w in argv if w != "--json"]
    if not words or words[0].startswith("-") or words[0] in _command_names(parser):
        return None
    from promptyoself.targets import registry

    name = words[0]
    if name not in registry.names():
        return None  # argparse says it is no command
    try:
        hook = getattr(registry.plugin(name), "cli", None)
    except Exception as exc:
        parser.exit(1, f"promptyoself {name}: {exc}\n")
    if hook is None:
        parser.exit(EXIT_USAGE, f"promptyoself: target {name!r} has no commands of its own\n")
    sub = argparse.ArgumentParser(prog=f"promptyoself {name}")
    run: Run = hook(sub)
    args = sub.parse_args(words[1:])
    args.command = name
    if "--json" in argv:
        args.json = True
    return args, run


def _command_names(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def main(argv: list[str] | None = None, *, core: Core | None = None) -> int:
    """Run one command. ``core`` may be passed in by tests; otherwise it is built from settings."""
    parser = cli_parser()
    run: Run | None
    try:
        found = _target_command(parser, sys.argv[1:] if argv is None else argv)
        if found is not None:
            args, run = found
        else:
            args = parser.parse_args(argv)
            run = COMMANDS.get(args.command) if args.command else None
    except SystemExit as exc:  # argparse: --help exits 0, usage errors exit 2
        return int(exc.code or 0)
    if args.command == "serve":  # no Run of its own; it refuses PROMPTYOSELF_AGENT_TOKEN itself (faces/serve.py)
        from promptyoself.faces.serve import serve

        return serve(args)
    if args.command is None or run is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    as_json = want_json(args)
    own_core = core is None
    # imported after parsing: `--help` and usage errors need the standard library only
    from promptyoself.config import ConfigError
    from promptyoself.errors import PromptYoSelfError
    from promptyoself.faces import tables
    from promptyoself.faces.cli_errors import cli_error

    try:
        if own_core:
            from promptyoself.config import load_settings
            from promptyoself.core.operations import Core
            from promptyoself.logs import add_secret_source, setup_logging
            from promptyoself.targets import registry

            settings = load_settings()
            add_secret_source(registry.secrets)  # the targets' own secrets, hidden from the first line on
            setup_logging(settings)
            quiet_stderr(settings, args.command)
            core = Core(settings)
            if args.command != "worker":  # every write checks who delivers (promptyoself.delivery.starter)
                from promptyoself.delivery.starter import starter_for

                starter_for(core)
        if core is not None:
            scope_to_agent(core, args)
        result = run(core, args)
    except ConfigError as exc:  # bad configuration (env or .env): one line on stderr, nothing on stdout, exit 2
        return exc.report()
    except UsageError as exc:
        sys.stderr.write(f"promptyoself {args.command}: {exc}\n")
        if as_json:
            emit({"status": "error", "error": str(exc), "code": "usage"}, True)
        return EXIT_USAGE
    except PromptYoSelfError as exc:
        error = cli_error(exc)  # the core words next steps for MCP; this face names its own commands
        if (args.command == "schedule" and exc.code in UNCHECKED_CODES
                and not getattr(args, "skip_validation", True)):
            error["error"] += (" The agent is checked on Letta before it is scheduled: add --skip-validation to "
                               "schedule without that check (delivery still needs Letta when it is due).")
        if as_json:
            emit(error, True)
        else:
            sys.stderr.write(f"error ({exc.code}): {tables.clean(error['error'])}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:  # Ctrl-C (long-running commands stop gracefully first): no traceback
        return 130  # 128 + SIGINT, as shells report an interrupted command
    except Exception:  # a bug: log it (stderr/log file), never print a traceback as the result
        import logging

        logging.getLogger("promptyoself.faces.cli").exception("command %s failed", args.command)
        error = {
            "status": "error",
            "code": "internal",
            "error": "Internal error; the log has the details. Run `promptyoself health` to check.",
        }
        if as_json:
            emit(error, True)
        else:
            sys.stderr.write(f"error (internal): {error['error']}\n")
        return EXIT_FAILED
    finally:
        if own_core and core is not None:
            core.close()
    if own_core and core is not None and args.command != "worker":
        announce_worker(core)
    if result is not None:
        emit(result, as_json, _zone(core) if core is not None else None)
        if result.get("status") == "error":
            return EXIT_FAILED
        if args.command == "execute" and any(not item.get("delivered") for item in result.get("executed") or ()):
            return EXIT_FAILED  # a due prompt was not delivered (retry, failed, ...): the message says how many
        if args.command == "health" and result.get("status") != "ok":
            return EXIT_FAILED  # degraded or down: the reasons say why
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
