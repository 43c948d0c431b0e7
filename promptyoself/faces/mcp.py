"""The MCP server: each tool is a typed signature, a docstring and one call into the core.

Nothing but JSON-RPC may reach stdout in stdio mode, so this module sets FastMCP's update check off
before FastMCP is imported and runs with the banner off.
"""

from __future__ import annotations

import difflib
import inspect
import json
import logging
import os
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_type_hints

os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")
os.environ.setdefault("FASTMCP_SHOW_SERVER_BANNER", "false")

from fastmcp import Context, FastMCP
from fastmcp.exceptions import NotFoundError, ToolError, ValidationError
from fastmcp.server.dependencies import get_http_headers
from fastmcp.server.middleware import Middleware, MiddlewareContext
from mcp.types import ToolAnnotations
from pydantic import Field
from pydantic import ValidationError as PydanticValidationError

from promptyoself import __version__
from promptyoself.core.agents import CallContext
from promptyoself.core.operations import Core, ScheduleOptions
from promptyoself.core.results import (
    AgentsResult,
    CancelResult,
    DefaultAgentResult,
    DiagnosticsResult,
    ExecuteResult,
    ExecutorStatus,
    HealthResult,
    HistoryResult,
    ListResult,
    ScheduleResult,
    StateResult,
    TestResult,
    UploadResult,
)
from promptyoself.errors import InvalidArgument, NotFound, PromptYoSelfError
from promptyoself.faces import jsonrpc_repair
from promptyoself.faces.jsonrpc_repair import MARK as INVALID_UNICODE

log = logging.getLogger(__name__)

INSTRUCTIONS = """PromptYoSelf schedules prompts that are delivered to you (a Letta agent) later.
Use promptyoself_schedule_time for one reminder ("tomorrow at 9am", "in 5m", "2026-12-25T09:00:00+01:00"),
promptyoself_schedule_cron for calendar rules ("every weekday at 9", "0 9 * * MON-FRI", an RFC 5545 RRULE,
in a timezone) and promptyoself_schedule_every for fixed intervals ("30m", max_repetitions=10).
Each result lists the next runs (`upcoming`) and the rule in words (`description`): check them.
Pass your own agent_id: Letta does not tell stdio servers who is calling.
Deliveries are budgeted per day and new schedules per hour (promptyoself_list shows your guardrails):
change or reuse a schedule rather than making a new one from every prompt."""

PASS_THROUGH: tuple[inspect.Parameter, ...] = tuple(
    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann)
    for name, ann in (
        ("mcp_server_id", str | None),
        ("mcp_server_name", str | None),
        ("request_heartbeat", bool | None),
        ("heartbeat", bool | None),
    )
)
_PASS_NAMES = frozenset(p.name for p in PASS_THROUGH)


def error_json(exc: PromptYoSelfError) -> str:
    return json.dumps(exc.to_dict(), default=str)


def user_error(tool: str, exc: PromptYoSelfError) -> ToolError:
    """A caller's error as an MCP tool error: our JSON, logged once here at INFO with its code and
    message. FastMCP logs every ToolError itself ("Error calling tool ...", no reason) at the error's
    ``log_level``: DEBUG here, since this line says it all."""
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
    own = [k for k in props if k not in _PASS_NAMES]
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
    return CallContext(meta=meta or None, header_agent_id=header, scope_key=scope)


def _request_meta(context: MiddlewareContext[Any]) -> dict[str, Any]:
    """The request's ``_meta`` (the wire request's, which the middleware's own message does not carry)."""
    try:
        rc = context.fastmcp_context.request_context if context.fastmcp_context is not None else None
        meta = rc.meta if rc is not None else None
    except Exception:  # no request context
        return {}
    return meta if isinstance(meta, dict) else {}


class ArgumentErrors(Middleware):
    """Calls that do not fit a tool get our JSON error shape, before the tool runs: an unknown tool
    (code ``not_found``, naming the tools), unknown or missing argument names (``invalid_argument``,
    one line naming them and the arguments the tool takes) and values of the wrong type
    (``invalid_argument``, pydantic's message per argument). Logged at INFO: they are the caller's."""

    def __init__(self) -> None:
        self._schemas: dict[str, dict[str, Any]] = {}  # input schema by tool name (the tools are fixed once built)

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        name = str(context.message.name)
        args = context.message.arguments or {}
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
        try:
            return await call_next(context)
        except NotFoundError:
            raise await self._unknown_tool(server, name) from None
        except ValidationError as exc:
            raise user_error(name, InvalidArgument(describe_validation(name, exc))) from None

    @staticmethod
    async def _unknown_tool(server: Any, name: str) -> ToolError:
        known = sorted(t.name for t in await server.list_tools(run_middleware=False)) if server is not None else []
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        listed = f" The tools are: {', '.join(known)}." if known else ""
        return user_error(name[:100], NotFound(f"Unknown tool {name[:100]!r}.{hint}{listed}"))


def _register(
    mcp: FastMCP,
    core: Core,
    fn: Callable[..., Any],
    *,
    read_only: bool = False,
    destructive: bool = False,
    idempotent: bool = False,
    open_world: bool = False,
    title: str | None = None,
) -> None:
    """Register ``fn`` as a tool: add the pass-through arguments, inject the call context where
    ``fn`` takes ``call``, spread ``options`` (``ScheduleOptions``) into the tool's arguments, and map
    core errors onto MCP tool errors."""
    sig = inspect.signature(fn)
    hints = get_type_hints(fn, include_extras=True)
    wants_call = "call" in sig.parameters
    wants_options = "options" in sig.parameters
    params = [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in sig.parameters.values()
        if p.name not in ("call", "options")
    ]
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
    if wants_options:
        params.extend(SCHEDULE_OPTIONS)
    ctx_param = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Context | None)

    def tool(**kwargs: Any) -> Any:
        ctx = kwargs.pop("ctx", None)
        for name in _PASS_NAMES:
            kwargs.pop(name, None)
        if wants_call:
            kwargs["call"] = call_context(ctx)
        if wants_options:
            options = {p.name: kwargs.pop(p.name, p.default) for p in SCHEDULE_OPTIONS}
            kwargs["options"] = {**options, "ctx": call_context(ctx)}
        core.tool_calls += 1
        try:
            return fn(**kwargs)
        except PromptYoSelfError as exc:  # the caller's error: INFO, with its code and message
            raise user_error(fn.__name__, exc) from None
        except Exception:  # a bug: ERROR with the traceback, in the log only
            log.exception("tool %s failed", fn.__name__)
            raise ToolError(error_json(INTERNAL), log_level=logging.DEBUG) from None

    tool.__name__ = fn.__name__
    # The description is passed as is: left as a docstring, FastMCP would load griffe and run three
    # docstring parsers over each tool at start-up, to find sections these one-liners do not have.
    tool.__doc__ = None
    tool.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[*params, *PASS_THROUGH, ctx_param], return_annotation=hints.get("return")
    )
    tool.__annotations__ = {
        **{p.name: p.annotation for p in params},
        **{p.name: p.annotation for p in PASS_THROUGH},
        "ctx": Context | None,
        "return": hints.get("return"),
    }
    mcp.tool(
        tool,
        name=fn.__name__,
        description=inspect.getdoc(fn),
        annotations=ToolAnnotations(
            title=title,
            readOnlyHint=read_only,
            destructiveHint=destructive,
            idempotentHint=idempotent,
            openWorldHint=open_world,
        ),
    )


AgentId = Annotated[
    str | None,
    Field(description="Letta agent id (agent-<uuid>). Omit to infer it (see promptyoself_inference_diagnostics)."),
]
Timezone = Annotated[
    str | None,
    Field(
        description="IANA timezone for naive times and cron, e.g. 'Europe/Berlin'. Default PROMPTYOSELF_TIMEZONE (UTC)."
    ),
]
Prompt = Annotated[str, Field(description="The text the agent will receive.")]
SkipValidation = Annotated[bool, Field(description="Do not check on Letta that the agent exists.")]
IdempotencyKey = Annotated[
    str | None,
    Field(description="Retry-safe key: a second call with the same key returns the first schedule."),
]
MaxPerDay = Annotated[
    int | None,
    Field(description="Deliver at most this many a day (>= 1); more are recorded over_budget, not sent."),
]
ScheduleId = Annotated[int | str, Field(description="A schedule id from promptyoself_list.")]
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
CatchUp = Annotated[
    Literal["skip", "latest", "all"] | None,
    Field(description="Missed runs (server down): 'latest' (default) one run for what was missed, within "
          "PROMPTYOSELF_MISFIRE_GRACE; 'skip' none; 'all' each one (at most 10). Missed ones show in history."),
]


SCHEDULE_OPTIONS: tuple[inspect.Parameter, ...] = tuple(
    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann)
    for name, ann, default in (
        ("agent_id", AgentId, None),
        ("timezone", Timezone, None),
        ("skip_validation", SkipValidation, False),
        ("idempotency_key", IdempotencyKey, None),
        ("catch_up", CatchUp, None),
        ("max_per_day", MaxPerDay, None),
    )
)


def build_server(core: Core, *, lifespan: Any = None) -> FastMCP:
    """The FastMCP app with every PromptYoSelf tool bound to ``core``."""
    kwargs: dict[str, Any] = {"instructions": INSTRUCTIONS, "version": __version__}
    if lifespan is not None:
        kwargs["lifespan"] = lifespan
    jsonrpc_repair.install()  # a line with a lone surrogate gets an answer, not silence
    mcp = FastMCP("promptyoself", **kwargs)
    mcp.add_middleware(ArgumentErrors())

    def promptyoself_schedule_time(prompt: Prompt, time: When, options: ScheduleOptions) -> ScheduleResult:
        """Schedule a one-time prompt to be delivered to the agent at `time`."""
        return core.schedule_time(prompt, time, **options)

    def promptyoself_schedule_cron(prompt: Prompt, cron: CronRule, options: ScheduleOptions) -> ScheduleResult:
        """Schedule a recurring prompt on a rule (words, RFC 5545 RRULE or cron), in an IANA timezone (DST-safe)."""
        return core.schedule_cron(prompt, cron, **options)

    def promptyoself_schedule_every(
        prompt: Prompt,
        every: Annotated[
            str | int,
            Field(description="Interval: '30s', '5m', '1h', '1h30m', 'PT15M', or whole seconds (text or integer); "
                  "at least PROMPTYOSELF_MIN_INTERVAL (default 10s)."),
        ],
        start_at: Annotated[
            str | None, Field(description="First run (same formats as `time`); default now + every.")
        ] = None,
        max_repetitions: Annotated[int | None, Field(description="Stop after this many deliveries (>= 1).")] = None,
        *,
        options: ScheduleOptions,
    ) -> ScheduleResult:
        """Schedule a prompt at a fixed rate: run k is at start_at + k*every (no drift)."""
        return core.schedule_every(
            prompt, every, start_at=start_at, max_repetitions=max_repetitions, **options
        )

    def promptyoself_list(
        agent_id: AgentId = None,
        include_cancelled: Annotated[
            bool, Field(description="Also list cancelled, completed and failed schedules.")
        ] = False,
        limit: Annotated[int, Field(description="Page size, 1-500.")] = 50,
        offset: Annotated[int, Field(description="Rows to skip.")] = 0,
        call: CallContext | None = None,
    ) -> ListResult:
        """List schedules (the inferred agent's, or every agent's when none is inferable)."""
        return core.list_schedules(
            agent_id=agent_id,
            include_cancelled=include_cancelled,
            limit=limit,
            offset=offset,
            ctx=call,
        )

    def promptyoself_cancel(schedule_id: ScheduleId) -> CancelResult:
        """Cancel a schedule. Cancelling twice succeeds (already_cancelled=true)."""
        return core.cancel(schedule_id)

    def promptyoself_pause(schedule_id: ScheduleId) -> StateResult:
        """Pause a schedule; nothing is delivered until it is resumed."""
        return core.pause(schedule_id)

    def promptyoself_resume(schedule_id: ScheduleId) -> StateResult:
        """Resume a paused schedule; recurring ones continue at their next future slot."""
        return core.resume(schedule_id)

    def promptyoself_history(
        schedule_id: Annotated[int | str | None, Field(description="Only this schedule's deliveries.")] = None,
        agent_id: AgentId = None,
        limit: Annotated[int, Field(description="Rows, newest first, 1-500.")] = 20,
        call: CallContext | None = None,
    ) -> HistoryResult:
        """Delivery attempts, newest first: outcome, attempt, Letta run id, error, lateness."""
        return core.history(
            schedule_id=schedule_id, agent_id=agent_id, limit=limit, ctx=call
        )

    def promptyoself_test() -> TestResult:
        """Check the connection to the Letta server and count its agents."""
        return core.test_connection()

    def promptyoself_agents() -> AgentsResult:
        """List the agents on the Letta server."""
        return core.list_agents()

    def promptyoself_upload(
        source_code: Annotated[
            str, Field(description="Python source of one function, with type hints and a docstring.")
        ],
        name: Annotated[str | None, Field(description="The function's name (must match the source).")] = None,
        description: Annotated[str | None, Field(description="Tool description shown to agents.")] = None,
    ) -> UploadResult:
        """Upload a Python function to Letta as a tool."""
        return core.upload_tool(source_code, name=name, description=description)

    def promptyoself_inference_diagnostics(call: CallContext | None = None) -> DiagnosticsResult:
        """Show how the agent id would be inferred for this call, and from where."""
        return core.inference_diagnostics(call)

    def promptyoself_set_default_agent(
        agent_id: Annotated[str | None, Field(description="Agent id; null clears it.")],
    ) -> DefaultAgentResult:
        """Set the default agent for this server process."""
        return core.set_default_agent(agent_id)

    def promptyoself_set_scoped_default_agent(
        agent_id: Annotated[str | None, Field(description="Agent id; null clears it.")],
        call: CallContext | None = None,
    ) -> DefaultAgentResult:
        """Set the default agent for this client session only."""
        return core.set_scoped_default_agent(agent_id, call)

    def promptyoself_get_scoped_default_agent(call: CallContext | None = None) -> DefaultAgentResult:
        """Show this client session's default agent."""
        return core.get_scoped_default_agent(call)

    def health() -> HealthResult:
        """Server health: version, Letta URL, database, executor, uptime, active schedules."""
        return core.health()

    write = {"read_only": False}
    _register(mcp, core, promptyoself_schedule_time, **write, open_world=True)
    _register(mcp, core, promptyoself_schedule_cron, **write, open_world=True)
    _register(mcp, core, promptyoself_schedule_every, **write, open_world=True)
    _register(mcp, core, promptyoself_list, read_only=True)
    _register(mcp, core, promptyoself_cancel, destructive=True, idempotent=True)
    _register(mcp, core, promptyoself_pause, idempotent=True)
    _register(mcp, core, promptyoself_resume, idempotent=True)
    _register(mcp, core, promptyoself_history, read_only=True)
    _register_delivery_tools(mcp, core)
    _register(mcp, core, promptyoself_test, read_only=True, open_world=True)
    _register(mcp, core, promptyoself_agents, read_only=True, open_world=True)
    _register(mcp, core, promptyoself_upload, open_world=True)
    _register(mcp, core, promptyoself_inference_diagnostics, read_only=True)
    _register(mcp, core, promptyoself_set_default_agent, idempotent=True)
    _register(mcp, core, promptyoself_set_scoped_default_agent, idempotent=True)
    _register(mcp, core, promptyoself_get_scoped_default_agent, read_only=True)
    _register(mcp, core, health, read_only=True)
    return mcp


def _register_delivery_tools(mcp: FastMCP, core: Core) -> None:
    """``execute`` and ``executor_status``: thin calls into the delivery side (promptyoself.delivery.service,
    imported on first call: it pulls in SQLAlchemy, which the MCP handshake does not need)."""
    def promptyoself_execute(
        loop: Annotated[bool, Field(description="Start the background executor and return at once.")] = False,
        interval: Annotated[
            float,
            Field(description="With loop=true: seconds between re-reads of the earliest due time.",
                  gt=0, allow_inf_nan=False),
        ] = 60,
    ) -> ExecuteResult:
        """Deliver every due prompt now (once), or start the background delivery loop (loop=true)."""
        from promptyoself.delivery import service as executor

        return executor.execute_tool(core, loop=loop, interval=interval)

    def promptyoself_executor_status() -> ExecutorStatus:
        """The delivery loop's state: running, last tick, next due, counts, auth errors, worker."""
        from promptyoself.delivery import service as executor

        return executor.status_tool(core)

    _register(mcp, core, promptyoself_execute)
    _register(mcp, core, promptyoself_executor_status, read_only=True)
