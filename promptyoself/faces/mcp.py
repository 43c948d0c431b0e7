"""The MCP server: plain ``@tool`` functions over the core, a module-level server ``mcp`` and one
middleware.

Each tool is a typed signature, a docstring and one call into the core. The tools reach their
``Core`` through a dependency (``TheCore``): the core ``build_server(core)`` bound the serving app to,
or, for the module-level ``mcp`` (which ``fastmcp inspect|dev|run promptyoself/faces/mcp.py`` load),
a default one made from the settings on its first call, so loading the module touches neither the
database nor Letta. ``build_server`` reuses the tools ``mcp`` holds (their schemas are built once per
process), so an app per Core costs ~0.2 ms (it was ~25 ms).

The ``ToolCalls`` middleware does what every tool has in common: it accepts and drops the arguments
Letta forwards to every tool (and lists them in every tool's input schema), answers calls that do not
fit a tool, and maps errors onto MCP tool errors with our JSON.

Nothing but JSON-RPC may reach stdout in stdio mode, so this module sets FastMCP's update check off
before FastMCP is imported and runs with the banner off.
"""

from __future__ import annotations

import difflib
import inspect
import json
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar, get_type_hints

os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")
os.environ.setdefault("FASTMCP_SHOW_SERVER_BANNER", "false")

from fastmcp import Context, FastMCP
from fastmcp.dependencies import Depends
from fastmcp.exceptions import NotFoundError, ToolError, ValidationError
from fastmcp.server.dependencies import get_context, get_http_headers, get_http_request, get_server
from fastmcp.server.middleware import Middleware, MiddlewareContext
from fastmcp.tools import Tool
from mcp.types import ToolAnnotations
from pydantic import Field
from pydantic import ValidationError as PydanticValidationError

from promptyoself import __version__
from promptyoself.core.agents import CallContext
from promptyoself.core.checks import Whole
from promptyoself.core.operations import Core
from promptyoself.core.operator import BudgetResult
from promptyoself.core.options import OPTION_NAMES, OverlapPolicy, ScheduleOptions
from promptyoself.core.results import (
    AgentsResult,
    CancelResult,
    DefaultAgentResult,
    DiagnosticsResult,
    HealthResult,
    HistoryResult,
    ListResult,
    OverlapResult,
    ScheduleResult,
    StateResult,
    TargetsResult,
    TestResult,
    UploadResult,
)
from promptyoself.errors import InvalidArgument, NotFound, PromptYoSelfError
from promptyoself.faces import jsonrpc_repair
from promptyoself.faces.delivery_results import ExecuteResult, ExecutorStatus
from promptyoself.faces.http_auth import caller_agent
from promptyoself.faces.jsonrpc_repair import MARK as INVALID_UNICODE

log = logging.getLogger(__name__)

INSTRUCTIONS = """PromptYoSelf schedules prompts delivered to you later (a Letta agent, or this Claude Code session).
Use promptyoself_schedule_time for one reminder ("tomorrow at 9am", "in 5m", "2026-12-25T09:00:00+01:00"),
promptyoself_schedule_cron for calendar rules ("every weekday at 9", "0 9 * * MON-FRI", an RFC 5545 RRULE,
in a timezone) and promptyoself_schedule_every for fixed intervals ("30m", max_repetitions=10).
Each result lists the next runs (`upcoming`) and the rule in words (`description`): check them.
Under Letta pass your own agent_id (Letta does not tell stdio servers who is calling); in a Claude Code
session pass no ids: the prompt comes back to this session.
Prefer PromptYoSelf to a session's own CronCreate / ScheduleWakeup for anything that must not be lost:
a schedule here outlives the session (kept in a database, delivered as a resumed turn once the session
is closed), catches up runs missed while nothing ran, arrives exactly once, and the operator sees it.
Deliveries are budgeted per day and new schedules per hour (promptyoself_list shows your guardrails):
change or reuse a schedule rather than making a new one from every prompt."""

_NULLABLE_STR = {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
_NULLABLE_BOOL = {"anyOf": [{"type": "boolean"}, {"type": "null"}], "default": None}
PASS_THROUGH: dict[str, dict[str, Any]] = {
    "mcp_server_id": _NULLABLE_STR,
    "mcp_server_name": _NULLABLE_STR,
    "request_heartbeat": _NULLABLE_BOOL,
    "heartbeat": _NULLABLE_BOOL,
}
"""The arguments Letta forwards to every tool: listed in every tool's input schema, accepted and
dropped by ``ToolCalls``."""


# ---- errors ----------------------------------------------------------------------------------------


def error_json(exc: PromptYoSelfError) -> str:
    return json.dumps(exc.to_dict(), default=str)


def user_error(tool: str, exc: PromptYoSelfError) -> ToolError:
    """A caller's error as an MCP tool error: our JSON, logged once here at INFO with its code and
    message (FastMCP's own line for it is kept at DEBUG: ``FastMCPsLineAtDebug``)."""
    log.info("%s: %s: %s", tool, exc.code, exc.message)
    return ToolError(error_json(exc), log_level=logging.DEBUG)


INTERNAL = PromptYoSelfError(  # the base class carries code "internal"
    "Internal error; the server log has the details. Try again, and call health to check the server."
)


def _quoted(names: list[str], limit: int = 5) -> str:
    shown = [repr(n[:60]) for n in names[:limit]]
    return ", ".join(shown) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def argument_problem(tool: str, schema: dict[str, Any], args: dict[str, Any]) -> str | None:
    """Unknown or missing argument names, in one line with the arguments ``tool`` takes; None if the
    names fit (their values are pydantic's to check)."""
    props: dict[str, Any] = schema.get("properties") or {}
    unknown = [str(k) for k in args if k not in props]
    missing = [str(k) for k in schema.get("required") or [] if k not in args]
    if not unknown and not missing:
        return None
    own = [k for k in props if k not in PASS_THROUGH]
    parts = []
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        close = difflib.get_close_matches(unknown[0], own, n=1) if len(unknown) == 1 else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        parts.append(f"unknown argument{plural} {_quoted(unknown)}{hint}")
    if missing:
        parts.append(f"missing required argument{'s' if len(missing) > 1 else ''} {_quoted(missing)}")
    return f"{' and '.join(parts)} for {tool}; expected: {', '.join(own) or 'no arguments'}"


def describe_validation(tool: str, exc: ValidationError) -> str:
    """pydantic's complaint about argument values, one line per argument and no documentation URL."""
    cause = exc.__cause__
    if not isinstance(cause, PydanticValidationError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "arguments do not fit the input schema"
        return f"invalid arguments for {tool}: {first[:300]}"
    by_arg: dict[str, list[str]] = {}
    for err in cause.errors(include_url=False, include_input=False):
        loc = err.get("loc") or ()
        name = str(loc[0]) if loc else "arguments"
        msgs = by_arg.setdefault(name, [])
        if err.get("msg") and err["msg"] not in msgs:
            msgs.append(str(err["msg"]))
    items = [(name[:60], " or ".join(msgs)[:200]) for name, msgs in list(by_arg.items())[:5]]
    if len(items) == 1:
        return f"invalid value for argument {items[0][0]!r} of {tool}: {items[0][1]}"
    return f"invalid values for {tool}: " + "; ".join(f"{name!r}: {msg}" for name, msg in items)


class FastMCPsLineAtDebug(logging.Filter):
    """FastMCP logs each exception a tool raises ("Error calling tool ...", at ERROR with a traceback)
    before any middleware sees it; ``ToolCalls`` logs it instead, once: a caller's error at INFO with
    its code, anything else at ERROR with its traceback. FastMCP's line is kept, at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and str(record.msg).startswith("Error calling tool"):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.exc_info, record.exc_text = None, None
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


_fastmcp_log = logging.getLogger("fastmcp.server.server")
if not any(isinstance(f, FastMCPsLineAtDebug) for f in _fastmcp_log.filters):
    _fastmcp_log.addFilter(FastMCPsLineAtDebug())


# ---- the core and the caller of a call ------------------------------------------------------------

_CORES: weakref.WeakKeyDictionary[FastMCP[Any], Core] = weakref.WeakKeyDictionary()
_default_lock = threading.Lock()


def core_of(server: FastMCP[Any]) -> Core:
    """The ``Core`` that ``server`` serves: the one ``build_server`` bound it to; for the module-level
    ``mcp``, one made from the settings (``PROMPTYOSELF_*``, ``LETTA_*``) on its first call."""
    core = _CORES.get(server)
    if core is None:
        with _default_lock:
            core = _CORES.get(server)
            if core is None:
                from promptyoself.config import load_settings

                core = _CORES[server] = Core(load_settings())
    return core


def call_context(ctx: Context | None) -> CallContext:
    """What the protocol tells us about the caller: request ``_meta``, ``X-Agent-Id``, session scope."""
    if ctx is None:
        return CallContext()
    meta: dict[str, Any] | None = None
    scope: str | None = None
    try:
        rc = ctx.request_context
        if rc is not None and isinstance(rc.meta, dict):
            meta = {k: v for k, v in rc.meta.items() if not k.startswith("io.modelcontextprotocol/")}
            meta.pop("progressToken", None)
    except Exception:  # no request context (e.g. called outside a request)
        meta = None
    try:
        scope_fn = getattr(ctx, "_session_scope_key", None)
        scope = scope_fn() if callable(scope_fn) else ctx.session_id
    except Exception:
        scope = None
    header = get_http_headers().get("x-agent-id")
    try:  # over HTTP: a remote caller, with the agent of its agent token (None: the operator)
        request = get_http_request()
    except RuntimeError:  # stdio: this process is the caller's (its PROMPTYOSELF_AGENT_TOKEN, if any)
        request = None
    who = caller_agent(request.scope) if request is not None else None
    return CallContext(meta=meta or None, header_agent_id=header, scope_key=scope, caller_agent=who,
                       remote=request is not None)


def current_core() -> Core:
    """The ``Core`` of the server answering this call (``core_of``)."""
    return core_of(get_server())


def current_call() -> CallContext:
    """This call's ``CallContext`` (``call_context``)."""
    try:
        ctx = get_context()
    except RuntimeError:  # no request (a direct call)
        return CallContext()
    return call_context(ctx)


TheCore = Annotated[Core, Depends(current_core)]
"""A tool's parameter for its core; injected, not in the input schema."""
TheCall = Annotated[CallContext, Depends(current_call)]
"""A tool's parameter for what the protocol says about the caller; injected, not in the input schema."""


# ---- the middleware --------------------------------------------------------------------------------


def _request_meta(context: MiddlewareContext[Any]) -> dict[str, Any]:
    """The request's ``_meta`` (the wire request's, which the middleware's own message does not carry)."""
    try:
        rc = context.fastmcp_context.request_context if context.fastmcp_context is not None else None
        meta = rc.meta if rc is not None else None
    except Exception:  # no request context
        return {}
    return meta if isinstance(meta, dict) else {}


class ToolCalls(Middleware):
    """What every tool has in common, for every tool.

    - The arguments Letta forwards to every tool (``PASS_THROUGH``): listed in each tool's input
      schema, accepted and dropped before the tool runs.
    - Calls that do not fit a tool get our JSON error before it runs: an unknown tool (``not_found``,
      naming the tools), unknown or missing argument names (``invalid_argument``, one line naming
      them and the arguments the tool takes), values of the wrong type (``invalid_argument``,
      pydantic's message per argument), text that is not valid Unicode (``invalid_argument``).
    - A ``PromptYoSelfError`` from the core becomes an MCP tool error with our JSON, logged at INFO;
      anything else is code ``internal``, logged at ERROR with its traceback, in the log only.
    - Each call that reaches a tool is counted (``Core.tool_calls``, in ``health``).
    """

    def __init__(self) -> None:
        self._schemas: dict[str, dict[str, Any]] = {}  # input schema by tool name (the tools are fixed once built)
        self._listed: dict[str, tuple[Tool, Tool]] = {}  # name -> (tool, tool as listed)

    async def on_list_tools(self, context: MiddlewareContext[Any], call_next: Any) -> Sequence[Tool]:
        return [self._as_listed(t) for t in await call_next(context)]

    def _as_listed(self, tool: Tool) -> Tool:
        known = self._listed.get(tool.name)
        if known is not None and known[0] is tool:
            return known[1]
        params = tool.parameters
        listed = tool.model_copy(update={"parameters": {**params, "properties": {
            **(params.get("properties") or {}), **PASS_THROUGH}}})
        self._listed[tool.name] = (tool, listed)
        return listed

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        name = str(context.message.name)
        given = context.message.arguments or {}
        args = {k: v for k, v in given.items() if k not in PASS_THROUGH}
        meta = _request_meta(context)
        if meta.get(INVALID_UNICODE):  # faces.jsonrpc_repair named them
            raise user_error(name, InvalidArgument(
                f"{meta[INVALID_UNICODE]} is not valid Unicode text (it holds a lone surrogate code point)."))
        server = context.fastmcp_context.fastmcp if context.fastmcp_context is not None else None
        schema = self._schemas.get(name)
        if schema is None and server is not None:
            tool = await server.get_tool(name)  # ~1 ms: once per tool
            if tool is None:
                raise await self._unknown_tool(server, name)
            schema = self._schemas[name] = tool.parameters
        if schema is not None:
            problem = argument_problem(name, schema, args)
            if problem is not None:
                raise user_error(name, InvalidArgument(problem))
        if len(args) != len(given):
            context = context.copy(message=context.message.model_copy(update={"arguments": args}))
        if server is not None:
            core_of(server).tool_calls += 1
        try:
            return await call_next(context)
        except NotFoundError:
            raise await self._unknown_tool(server, name) from None
        except ValidationError as exc:
            raise user_error(name, InvalidArgument(describe_validation(name, exc))) from None
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, PromptYoSelfError):  # the caller's error: INFO, with its code and message
                raise user_error(name, cause) from None
            if cause is None:  # a ToolError made on purpose (ours, or FastMCP's answer to a bad call)
                raise
            log.error("tool %s failed", name, exc_info=(type(cause), cause, cause.__traceback__))
            raise ToolError(error_json(INTERNAL), log_level=logging.DEBUG) from None

    @staticmethod
    async def _unknown_tool(server: Any, name: str) -> ToolError:
        known = sorted(t.name for t in await server.list_tools(run_middleware=False)) if server is not None else []
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        listed = f" The tools are: {', '.join(known)}." if known else ""
        return user_error(name[:100], NotFound(f"Unknown tool {name[:100]!r}.{hint}{listed}"))


# ---- the server ------------------------------------------------------------------------------------


@asynccontextmanager
async def _close_default_core(server: FastMCP[Any]) -> AsyncIterator[dict[str, Any]]:
    """The module-level server's lifespan: the default core, if a call made one, closes with it."""
    try:
        yield {}
    finally:
        core = _CORES.pop(server, None)
        if core is not None:
            core.close()


def _agent_scope() -> Middleware:
    """What an agent token may do (``promptyoself.faces.mcp_scope``), inside ``ToolCalls``."""
    from promptyoself.faces.mcp_scope import AgentScope

    return AgentScope(core_of, user_error)


def _ask_approval() -> Middleware:
    """A new schedule that waits for approval is put to the person at the client (elicitation), when
    the caller is the operator (``promptyoself.faces.mcp_approval``); innermost."""
    from promptyoself.faces.mcp_approval import AskApproval

    return AskApproval(core_of)


jsonrpc_repair.install()  # a line with a lone surrogate gets an answer, not silence
mcp: FastMCP[Any] = FastMCP("promptyoself", instructions=INSTRUCTIONS, version=__version__,
                            lifespan=_close_default_core)
mcp.add_middleware(ToolCalls())
mcp.add_middleware(_agent_scope())
mcp.add_middleware(_ask_approval())
TOOLS: list[Tool] = []
"""The tools of ``mcp``, in order; ``build_server`` serves the same ones."""

F = TypeVar("F", bound=Callable[..., Any])


def tool(
    *, read_only: bool = False, destructive: bool = False, idempotent: bool = False, open_world: bool = False
) -> Callable[[F], F]:
    """``@mcp.tool`` with these behaviour hints and the docstring as the description, passed as is:
    left for FastMCP to read, a docstring makes it import griffe and run three docstring parsers over
    each tool, looking for sections these one-liners do not have (~70 ms of every start)."""
    hints = ToolAnnotations(
        title=None, read_only_hint=read_only, destructive_hint=destructive, idempotent_hint=idempotent,
        open_world_hint=open_world,
    )

    def register(fn: F) -> F:
        description = inspect.getdoc(fn)
        fn.__doc__ = None
        try:
            made = Tool.from_function(fn, description=description, annotations=hints)
        finally:
            fn.__doc__ = description
        made.output_schema = inline_defs(made.output_schema)
        TOOLS.append(mcp.add_tool(made))
        return fn

    return register


_DEFS = "#/$defs/"


class _LeftToFastMCP(Exception):
    """A schema ``inline_defs`` does not cover: FastMCP dereferences it as it always did."""


def inline_defs(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """``schema`` with each ``{"$ref": "#/$defs/Name", ...}`` replaced by that definition (the ref's own
    keys kept over the definition's) and ``$defs`` dropped: what FastMCP's ``DereferenceRefsMiddleware``
    sends for our output schemas, made once as each tool is built. FastMCP makes it on every
    ``tools/list``, through jsonref, ~10 ms of each start for the seven schemas with definitions (the
    cold start: docs/performance.md); a schema with no ``$ref`` it sends as it is. A schema this does
    not cover (a reference outside its ``$defs``, a cycle, an OpenAPI discriminator) is returned
    unchanged, for FastMCP. tests/test_fastmcp_idioms.py checks that every tool's schema is FastMCP's
    ``dereference_refs`` of the one FastMCP built."""
    if not schema or "$defs" not in schema:
        return schema
    defs = schema["$defs"]

    def inline(node: Any, within: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [inline(item, within) for item in node]
        if not isinstance(node, dict):
            return node
        if "discriminator" in node and ("anyOf" in node or "oneOf" in node):
            raise _LeftToFastMCP
        own = {key: inline(value, within) for key, value in node.items() if key != "$ref"}
        if "$ref" not in node:
            return own
        ref = node["$ref"]
        name = ref.removeprefix(_DEFS) if isinstance(ref, str) and ref.startswith(_DEFS) else None
        if name is None or name not in defs or name in within:
            raise _LeftToFastMCP
        return {**inline(defs[name], within | {name}), **own}

    try:
        return inline({key: value for key, value in schema.items() if key != "$defs"}, frozenset())
    except _LeftToFastMCP:
        return schema


def build_server(core: Core, *, lifespan: Any = None) -> FastMCP[Any]:
    """A FastMCP app with every PromptYoSelf tool (those of ``mcp``), answering with ``core``."""
    kwargs: dict[str, Any] = {"instructions": INSTRUCTIONS, "version": __version__}
    if lifespan is not None:
        kwargs["lifespan"] = lifespan
    server: FastMCP[Any] = FastMCP("promptyoself", **kwargs)
    server.add_middleware(ToolCalls())
    server.add_middleware(_agent_scope())
    server.add_middleware(_ask_approval())
    for made in TOOLS:
        server.add_tool(made)
    _list_targets()
    _CORES[server] = core
    return server


def _list_targets() -> None:
    """The scheduling tools' ``target`` lists the installed targets (the registry, read as a server is
    built rather than when this module is imported: a distribution installed since is seen)."""
    from promptyoself.targets import registry

    names = list(registry.names())
    for made in TOOLS:
        target = made.parameters.get("properties", {}).get("target")
        for option in (target or {}).get("anyOf", ()):
            if option.get("type") == "string":
                option["enum"] = names


def with_options(fn: F) -> F:
    """A scheduling tool as clients see it: ``fn(<its own arguments>, *, options: ScheduleOptions, ...)``
    becomes a function whose arguments are ``fn``'s own, then each field of ``ScheduleOptions`` as a
    flat argument (its type, default and description: the input schema comes from the model), then the
    injected ones. A call validates the flat options through the model and passes ``fn`` one value."""
    hints = get_type_hints(fn, include_extras=True)
    params = [p.replace(annotation=hints[p.name]) for p in inspect.signature(fn).parameters.values()]
    own = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    injected = [p for p in params if p.kind is p.KEYWORD_ONLY and p.name != "options"]
    flat = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=field.default,
                          annotation=Annotated[field.annotation, Field(description=field.description)])
        for name, field in ScheduleOptions.model_fields.items()
    ]
    signature = inspect.Signature([*own, *flat, *injected], return_annotation=hints.get("return"))

    async def flat_tool(*args: Any, **kwargs: Any) -> Any:
        given = signature.bind(*args, **kwargs)
        given.apply_defaults()
        values = dict(given.arguments)
        options = ScheduleOptions.of({name: values.pop(name) for name in OPTION_NAMES})
        return await fn(**values, options=options)

    flat_tool.__name__, flat_tool.__qualname__ = fn.__name__, fn.__qualname__
    flat_tool.__module__, flat_tool.__doc__ = fn.__module__, fn.__doc__
    flat_tool.__signature__ = signature  # type: ignore[attr-defined]
    flat_tool.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    flat_tool.__annotations__["return"] = signature.return_annotation
    return flat_tool  # type: ignore[return-value]


# ---- argument types --------------------------------------------------------------------------------

AgentId = Annotated[str | None, Field(description=ScheduleOptions.model_fields["agent_id"].description)]
"""``agent_id`` of the reading tools (list, history), described as the scheduling tools' option."""
Prompt = Annotated[str, Field(description="The text the agent will receive.")]
ScheduleId = Annotated[Whole | str, Field(description="A schedule id from promptyoself_list.")]
When = Annotated[
    str,
    Field(
        description="When, read in `timezone`: 'tomorrow at 9am', 'today 17:30', '9pm', 'noon', 'monday 9:00', "
        "'next friday at 14:30', 'Dec 25 at 9', '2027-01-15 9am', relative 'in 2 hours', 'in 5m', ISO 8601 "
        "('2026-12-25T09:00:00-05:00'), or with a zone ('2026-12-25 09:00 Europe/Berlin': that zone is used)."
    ),
]
CronRule = Annotated[
    str,
    Field(
        description="The rule, in `timezone`: words ('every weekday at 9', 'every 2 weeks on tuesday and "
        "thursday at 10:00', 'last friday of every month at 17:00'), an RFC 5545 RRULE "
        "('FREQ=MONTHLY;BYDAY=-1FR;BYHOUR=17;BYMINUTE=0', COUNT/UNTIL allowed), or 5-field cron "
        "('0 9 * * MON-FRI', '@daily')."
    ),
]
Every = Annotated[
    str | Whole,
    Field(description="Interval: '30s', '5m', '1h', '1h30m', 'PT15M', or whole seconds (text or integer); "
          "at least PROMPTYOSELF_MIN_INTERVAL (default 10s)."),
]
StartAt = Annotated[str | None, Field(description="First run (same formats as `time`); default now + every.")]
MaxRepetitions = Annotated[Whole | None, Field(description="Stop after this many deliveries (>= 1).")]
NewDefaultAgent = Annotated[str | None, Field(description="Agent id; null clears it.")]


# ---- the tools -------------------------------------------------------------------------------------


@tool(open_world=True)
@with_options
async def promptyoself_schedule_time(
    prompt: Prompt,
    time: When,
    *,
    options: ScheduleOptions,
    core: TheCore,
    call: TheCall,
) -> ScheduleResult:
    """Schedule a one-time prompt to be delivered to the agent at `time` (outlives the session, unlike CronCreate)."""
    return await core.scheduling.schedule_time(prompt, time, options, ctx=call)


@tool(open_world=True)
@with_options
async def promptyoself_schedule_cron(
    prompt: Prompt,
    cron: CronRule,
    *,
    options: ScheduleOptions,
    core: TheCore,
    call: TheCall,
) -> ScheduleResult:
    """Schedule a recurring prompt on a rule (words, RFC 5545 RRULE or cron), in an IANA timezone (DST-safe)."""
    return await core.scheduling.schedule_cron(prompt, cron, options, ctx=call)


@tool(open_world=True)
@with_options
async def promptyoself_schedule_every(
    prompt: Prompt,
    every: Every,
    start_at: StartAt = None,
    max_repetitions: MaxRepetitions = None,
    *,
    options: ScheduleOptions,
    core: TheCore,
    call: TheCall,
) -> ScheduleResult:
    """Schedule a prompt at a fixed rate: run k is at start_at + k*every (no drift)."""
    return await core.scheduling.schedule_every(prompt, every, options, start_at=start_at,
                                                max_repetitions=max_repetitions, ctx=call)


@tool(read_only=True)
async def promptyoself_list(
    agent_id: AgentId = None,
    include_cancelled: Annotated[
        bool, Field(description="Also list cancelled, completed and failed schedules.")
    ] = False,
    limit: Annotated[Whole, Field(description="Page size, 1-500.")] = 50,
    offset: Annotated[Whole, Field(description="Rows to skip.")] = 0,
    *,
    core: TheCore,
    call: TheCall,
) -> ListResult:
    """List schedules (the inferred agent's, or every agent's when none is inferable)."""
    return await core.scheduling.list_schedules(
        agent_id=agent_id, include_cancelled=include_cancelled, limit=limit, offset=offset, ctx=call
    )


@tool(destructive=True, idempotent=True)
async def promptyoself_cancel(schedule_id: ScheduleId, *, core: TheCore) -> CancelResult:
    """Cancel a schedule. Cancelling twice succeeds (already_cancelled=true)."""
    return await core.scheduling.cancel(schedule_id)


@tool(idempotent=True)
async def promptyoself_pause(schedule_id: ScheduleId, *, core: TheCore) -> StateResult:
    """Pause a schedule; nothing is delivered until it is resumed."""
    return await core.scheduling.pause(schedule_id)


@tool(idempotent=True)
async def promptyoself_resume(schedule_id: ScheduleId, *, core: TheCore) -> StateResult:
    """Resume a paused schedule; recurring ones continue at their next future slot."""
    return await core.scheduling.resume(schedule_id)


@tool(idempotent=True)
async def promptyoself_set_overlap(
    schedule_id: ScheduleId,
    overlap: Annotated[OverlapPolicy, Field(description=(
        "'skip' (an occurrence due while the schedule's previous turn still runs is recorded skipped), 'queue' "
        "(it waits for that turn to end, at most one waiting) or 'allow' (sent anyway)."))],
    *,
    core: TheCore,
) -> OverlapResult:
    """Change a schedule's overlap policy (what happens to a run due while its previous turn still runs)."""
    return await core.scheduling.set_overlap(schedule_id, overlap)


@tool(read_only=True)
async def promptyoself_history(
    schedule_id: Annotated[Whole | str | None, Field(description="Only this schedule's deliveries.")] = None,
    agent_id: AgentId = None,
    limit: Annotated[Whole, Field(description="Rows, newest first, 1-500.")] = 20,
    *,
    core: TheCore,
    call: TheCall,
) -> HistoryResult:
    """Delivery attempts, newest first: outcome, attempt, Letta run id, error, lateness."""
    return await core.scheduling.history(schedule_id=schedule_id, agent_id=agent_id, limit=limit, ctx=call)


@tool(read_only=True)
async def promptyoself_budget(
    agent_id: AgentId = None,
    *,
    core: TheCore,
    call: TheCall,
) -> BudgetResult:
    """Your budgets today: prompts delivered, tokens and USD your turns reported, what is left of each
    and when they reset. When one is spent, your next prompts are held (recorded over_budget)."""
    return await core.scheduling.budget(agent_id=agent_id, ctx=call)


@tool()
def promptyoself_execute(
    loop: Annotated[bool, Field(description="Start the background executor and return at once.")] = False,
    interval: Annotated[
        float,
        Field(description="With loop=true: seconds between re-reads of the earliest due time.",
              gt=0, allow_inf_nan=False),
    ] = 60,
    *,
    core: TheCore,
) -> ExecuteResult:
    """Deliver every due prompt now (once), or start the background delivery loop (loop=true)."""
    # Imported on first call: it pulls in SQLAlchemy, which the MCP handshake does not need.
    from promptyoself.faces import delivery

    return delivery.execute_tool(core, loop=loop, interval=interval)


@tool(read_only=True)
def promptyoself_executor_status(*, core: TheCore) -> ExecutorStatus:
    """The delivery loop's state: running, last tick, next due, counts, auth errors, worker."""
    from promptyoself.faces import delivery  # on first call, as in promptyoself_execute

    return delivery.status_tool(core)


@tool(read_only=True, open_world=True)
def promptyoself_test(*, core: TheCore) -> TestResult:
    """Check the connection to the Letta server and count its agents."""
    return core.agents.test_connection()


@tool(read_only=True, open_world=True)
def promptyoself_agents(*, core: TheCore) -> AgentsResult:
    """List the agents on the Letta server."""
    return core.agents.list_agents()


@tool(open_world=True)
def promptyoself_upload(
    source_code: Annotated[str, Field(description="Python source of one function, with type hints and a docstring.")],
    name: Annotated[str | None, Field(description="The function's name (must match the source).")] = None,
    description: Annotated[str | None, Field(description="Tool description shown to agents.")] = None,
    *,
    core: TheCore,
) -> UploadResult:
    """Upload a Python function to Letta as a tool."""
    return core.agents.upload_tool(source_code, name=name, description=description)


@tool(read_only=True)
def promptyoself_inference_diagnostics(*, core: TheCore, call: TheCall) -> DiagnosticsResult:
    """Show how the agent id would be inferred for this call, and from where."""
    return core.agents.inference_diagnostics(call)


@tool(idempotent=True)
def promptyoself_set_default_agent(agent_id: NewDefaultAgent, *, core: TheCore) -> DefaultAgentResult:
    """Set the default agent for this server process."""
    return core.agents.set_default_agent(agent_id)


@tool(idempotent=True)
def promptyoself_set_scoped_default_agent(
    agent_id: NewDefaultAgent, *, core: TheCore, call: TheCall
) -> DefaultAgentResult:
    """Set the default agent for this client session only."""
    return core.agents.set_scoped_default_agent(agent_id, call)


@tool(read_only=True)
def promptyoself_get_scoped_default_agent(*, core: TheCore, call: TheCall) -> DefaultAgentResult:
    """Show this client session's default agent."""
    return core.agents.get_scoped_default_agent(call)


@tool(read_only=True, open_world=True)
async def promptyoself_targets(*, core: TheCore) -> TargetsResult:
    """List where prompts can be delivered: each installed target, its target_options and whether it is
    ready here. Pass one as `target` (with its options as `target_options`) to a schedule tool."""
    return await core.targets()


@tool(read_only=True)
async def health(*, core: TheCore) -> HealthResult:
    """Server health: version, Letta URL, database, executor, uptime, active schedules."""
    return await core.health()


_list_targets()  # the module's own app (``fastmcp inspect``, ``fastmcp run``) lists them too
