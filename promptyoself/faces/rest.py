"""PromptYoSelf's REST face: Letta's scheduling routes, and PromptYoSelf's own routes under ``/api``.

``build_rest_app(core)`` returns an ASGI app (FastAPI: the request models of ``/api`` give an
OpenAPI document at ``/openapi.json`` and 422s on malformed bodies for free; the Letta routes read
the raw body so that their shapes and 400s are exactly those of ``core.letta_schedules``). The
always-on ``serve`` command mounts it next to ``/mcp``. Every route needs ``Authorization: Bearer
<PROMPTYOSELF_HTTP_TOKEN>`` when that token is set (401 otherwise; the Letta password is NOT accepted
in its place), except the API's description: ``/openapi.json`` and ``/docs`` (Swagger UI, its files
served from the ``swagger-ui-bundle`` package, so it works offline; ``/`` and ``/redoc`` lead there).

Errors have the MCP tools' shape, ``{"status": "error", "error", "code"}``, with 400 (a bad
argument), 404 (no such schedule, agent or route), 409 (an idempotency key reused with other
arguments, the agent's live-schedule quota), 413 (a prompt over the limit), 422 (a body that does not
fit, an interval under the minimum), 502/503 (Letta, the database), 500 (a bug; details in the log
only); 429 only for a rate (``rate_limited``: an agent's schedules per hour, with ``Retry-After``).
The texts name REST routes where the core
names MCP tools (``NEXT_STEPS``). ``X-Agent-Id`` names the calling agent when the body or query does
not, as on ``/mcp``.

Letta routes: ``POST``/``GET /v1/agents/{agent_id}/schedule``, ``GET``/``DELETE
/v1/agents/{agent_id}/schedule/{scheduled_message_id}``.
Own routes (the MCP tools' operations, same JSON results): ``POST /api/schedules/time``,
``POST /api/schedules/cron``, ``POST /api/schedules/every``, ``GET /api/schedules``,
``GET /api/history``, ``GET /api/targets``, ``POST /api/schedules/{id}/pause``, ``POST /api/schedules/{id}/resume``,
``POST /api/schedules/{id}/overlap``,
``DELETE /api/schedules/{id}`` (cancel).
Operator routes: ``GET``/``PUT /api/policy`` (the guardrails every writer enforces).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictFloat, StrictInt, StrictStr
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, RedirectResponse, Response

from promptyoself.core import agent_tokens, native_tools
from promptyoself.core.agents import CallContext
from promptyoself.core.checks import MAX_ID, Whole, canonical_id
from promptyoself.core.letta_schedules import LettaSchedules
from promptyoself.core.options import OPTION_NAMES, OverlapPolicy, ScheduleOptions
from promptyoself.errors import (
    AgentNotFound,
    AgentRequired,
    BadNumber,
    DatabaseDriverMissing,
    DatabaseUnavailable,
    Forbidden,
    IdempotencyConflict,
    IntervalTooShort,
    InvalidArgument,
    NotFound,
    PromptTooLong,
    PromptYoSelfError,
    QuotaExceeded,
    RateLimited,
    TargetAuth,
    TargetUnavailable,
    Unauthorized,
)
from promptyoself.faces.http_auth import agent_resolver, bearer_middleware, caller_agent

if TYPE_CHECKING:
    from promptyoself.core.operations import Core

log = logging.getLogger(__name__)

_STATUS: list[tuple[type[PromptYoSelfError], int]] = [  # the first that matches (subclasses first)
    (NotFound, 404),
    (Forbidden, 403),
    (Unauthorized, 401),
    (AgentNotFound, 404),
    (PromptTooLong, 413),
    (IntervalTooShort, 422),
    (BadNumber, 422),  # NaN, Infinity, true for a number: as FastAPI answers a value that does not fit
    (InvalidArgument, 400),
    (AgentRequired, 400),
    (IdempotencyConflict, 409),
    (QuotaExceeded, 409),  # the agent's live schedules: a state of the data, not a rate (429 is for rates)
    (RateLimited, 429),  # schedules made per hour: a rate (Retry-After)
    (TargetAuth, 502),
    (TargetUnavailable, 503),
    (DatabaseUnavailable, 503),
    (DatabaseDriverMissing, 503),
]

NEXT_STEPS: dict[str, str] = {
    "Call promptyoself_list (with include_cancelled=true for ended ones) to see the ids.":
        "GET /api/schedules?include_cancelled=true lists the ids.",
    "Call promptyoself_list to see ids.": "GET /api/schedules lists the ids.",
    "pass agent_id, or set PROMPTYOSELF_DEFAULT_AGENT_ID":
        "pass agent_id (or the X-Agent-Id header), or set PROMPTYOSELF_DEFAULT_AGENT_ID",
    "in the server's env, or call promptyoself_set_default_agent.": "in the service's environment.",
    "Letta does not tell stdio MCP servers which agent is calling. Run promptyoself_inference_diagnostics to "
    "see what was tried.": "GET /v1/agents on the Letta server lists the agents.",
    "Call promptyoself_agents to list the agents, or pass skip_validation=true to schedule anyway.":
        "GET /v1/agents on the Letta server lists the agents; send \"skip_validation\": true to schedule anyway.",
    "Call promptyoself_agents to list the agents, or pass skip_validation=true.":
        "GET /v1/agents on the Letta server lists the agents; or send \"skip_validation\": true.",
    "Call promptyoself_agents to list the agents.": "GET /v1/agents on the Letta server lists the agents.",
    "Cancel some with promptyoself_cancel first.": "Cancel some with DELETE /api/schedules/{id} first.",
}
"""The core words next steps for the MCP tools; the REST API names its own routes (the keys are
``faces/cli_errors.py``'s MCP phrases: tests/test_rest_api.py checks that both tables cover the same)."""


def rest_message(message: str) -> str:
    for mcp, rest in NEXT_STEPS.items():
        message = message.replace(mcp, rest)
    return message


def error_body(message: str, code: str, **details: Any) -> dict[str, Any]:
    """The one error shape of every face: ``{"status": "error", "error", "code"}`` (plus details)."""
    return {"status": "error", "error": message, "code": code, **details}


def error_response(exc: PromptYoSelfError) -> JSONResponse:
    """A core error as HTTP: 400/404/409/413/422 for the caller's mistakes, 502/503 when Letta or the
    database fails, 500 for a bug; the body is the MCP tools' error shape in the REST API's words."""
    status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
    body = exc.to_dict()
    body["error"] = rest_message(exc.message)
    wait = body.get("retry_after_s")
    headers = {"Retry-After": str(int(wait))} if status == 429 and isinstance(wait, int | float) else None
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_response(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 for a body or query that does not fit, in our shape: one line naming each field."""
    problems: list[str] = []
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    for err in errors:
        loc = ".".join(str(part) for part in err.get("loc", ())[1:]) or "body"
        problems.append(f"{loc}: {err.get('msg', 'invalid')}")
    message = "; ".join(problems) or "The request does not fit this route."
    return JSONResponse(error_body(message + " GET /docs describes each route.", "invalid_argument"), 422)


def _http_response(_: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
    if status == 404:
        body = error_body("Not found. GET /docs lists the routes (/api/..., /v1/agents/{agent_id}/schedule, "
                          "/mcp, /healthz, /metrics).", "not_found")
    elif status == 405:
        body = error_body("This route does not take that method. GET /docs lists the routes.", "invalid_argument")
    else:
        detail = exc.detail if isinstance(exc, StarletteHTTPException) else "error"
        body = error_body(str(detail), "invalid_argument" if status < 500 else "internal")
    headers = getattr(exc, "headers", None)
    return JSONResponse(body, status_code=status, headers=headers)


def _context(x_agent_id: str | None, request: Request | None = None) -> CallContext:
    """The caller's ``X-Agent-Id`` header (as on ``/mcp``): the agent when the body names none; the
    agent its agent token acts for (None: the operator); a remote caller (issue 42 point 2)."""
    value = (x_agent_id or "").strip()
    who = caller_agent(request) if request is not None else None
    return CallContext(header_agent_id=value or None, caller_agent=who, remote=True)


class _Common(ScheduleOptions):
    """A scheduling route's body: the schedule options (``core/options.py``: the MCP tools' and the
    CLI's too) and the prompt. A misspelt field is a 422 naming it, not silently dropped."""

    prompt: str = Field(description="The text the agent receives.")

    def options(self, agent_id: str | None) -> ScheduleOptions:
        """The body's options, for ``agent_id`` (the caller's: the token's agent for an agent token)."""
        return ScheduleOptions.model_validate({**self.model_dump(include=set(OPTION_NAMES)), "agent_id": agent_id})


class TimeRequest(_Common):
    time: str = Field(description="'tomorrow at 9am', 'monday 9:00', 'in 2 hours', ISO 8601, ... "
                      "(docs/promptyoself-tools.md lists every form).")


class CronRequest(_Common):
    cron: str = Field(description="Words ('every weekday at 9'), an RFC 5545 RRULE, or 5-field cron "
                      "('0 9 * * MON-FRI').")


class EveryRequest(_Common):
    every: str = Field(description="Interval: '30s', '5m', '1h30m', 'PT15M' or seconds.")
    start_at: str | None = Field(None, description="First run (ISO 8601 or 'in 10m'); default now + every.")
    max_repetitions: Whole | None = Field(None, description="Stop after this many deliveries.")


class OverlapBody(BaseModel):
    """``POST /api/schedules/{id}/overlap``: the schedule's new overlap policy."""

    model_config = ConfigDict(extra="forbid")

    overlap: OverlapPolicy = Field(description="'skip', 'queue' or 'allow' (docs/promptyoself-tools.md, Overlap).")


class PolicyRequest(BaseModel):
    """``PUT /api/policy``: the values to change (the others stay)."""

    model_config = ConfigDict(extra="forbid")

    max_deliveries_per_agent_per_day: StrictInt | None = Field(
        None, description="Daily delivery budget per agent (scheduled prompts and pass-through sends); 0 = none.")
    max_schedules_per_agent_per_hour: StrictInt | None = Field(
        None, description="Schedules an agent may create per hour; 0 = no limit.")
    approval_below: StrictStr | StrictInt | None = Field(
        None, description="Recurring schedules firing more often than this (alone or with the agent's other "
        "active schedules) wait for approval: a duration such as '30m', seconds, or 'off'.")
    max_active_per_agent: StrictInt | None = Field(None, description="Live (active or paused) schedules per agent.")
    pause_after_failures: StrictInt | None = Field(
        None, description="Failed occurrences in a row after which delivery pauses a schedule; 0 = never.")
    max_tokens_per_agent_per_day: StrictInt | None = Field(
        None, description="Daily token budget per agent (input + output tokens its delivered turns reported); "
        "0 = none.")
    max_cost_usd_per_agent_per_day: StrictFloat | StrictInt | StrictStr | None = Field(
        None, description="Daily cost budget per agent in USD (what its delivered turns reported), such as 2.50; "
        "0 = none.")


ScheduleId = Annotated[int, BeforeValidator(canonical_id), Field(gt=0, le=MAX_ID)]
"""A schedule id in a path or query: its canonical decimal text only (``12``; 422 for ``12.0``,
``" 12"``, ``0012``, ``1_2``, ``+12``, which a plain ``int`` reads as 12)."""

AGENT_HEADER: Any = Header(None, alias="X-Agent-Id",
                            description="The calling agent, used when agent_id is not given (as on /mcp).")

DOCS_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>PromptYoSelf API</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css"><link rel="icon" href="/docs/assets/favicon-32x32.png">
</head><body><div id="ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "/openapi.json", dom_id: "#ui", deepLinking: true, persistAuthorization: true});</script>
</body></html>"""
"""Swagger UI from the ``swagger-ui-bundle`` package, served by this app: the page works offline."""
DOCS_ASSETS = ("swagger-ui.css", "swagger-ui-bundle.js", "favicon-32x32.png", "favicon-16x16.png")


def _swagger_dir() -> Any:
    import swagger_ui_bundle

    return swagger_ui_bundle.swagger_ui_path


class RestApp(FastAPI):
    """FastAPI whose OpenAPI document declares the bearer scheme (PROMPTYOSELF_HTTP_TOKEN)."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            schema = super().openapi()
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "PROMPTYOSELF_HTTP_TOKEN (when the service has one)."}}
            schema["security"] = [{"bearer": []}]
            self.openapi_schema = schema
        return self.openapi_schema


def _mount_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI over ``/openapi.json``, its files served from here, not a CDN); ``/`` and
    ``/redoc`` lead there. These pages and ``/openapi.json`` are open without the bearer token (they
    describe the API, hold no data); the "Authorize" button sends the token with the calls tried."""
    types = {"css": "text/css", "js": "text/javascript", "png": "image/png"}

    async def docs() -> Response:
        return Response(DOCS_HTML, media_type="text/html")

    async def asset(name: str) -> Response:
        if name not in DOCS_ASSETS:
            raise StarletteHTTPException(404)
        data = await run_in_threadpool(_swagger_dir().joinpath(name).read_bytes)
        return Response(data, media_type=types[name.rsplit(".", 1)[-1]],
                        headers={"cache-control": "public, max-age=86400"})

    async def to_docs() -> RedirectResponse:
        return RedirectResponse("/docs", status_code=307)

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
    app.add_api_route("/docs/assets/{name}", asset, methods=["GET"], include_in_schema=False)
    for path in ("/", "/redoc", "/docs/"):
        app.add_api_route(path, to_docs, methods=["GET"], include_in_schema=False)



def _mount_proxy(app: FastAPI, core: Core) -> None:
    """Every other ``/v1/...`` request goes to Letta (``core/passthrough.py``), streamed both ways."""
    from starlette.background import BackgroundTask
    from starlette.responses import StreamingResponse

    from promptyoself.core.passthrough import count_send, letta_passthrough

    proxy = letta_passthrough(core.settings)

    async def forward(request: Request) -> Response:
        if caller_agent(request) is not None:  # the pass-through uses Letta with the operator's credentials
            return error_response(Forbidden("The Letta pass-through needs the operator token "
                                            "(PROMPTYOSELF_HTTP_TOKEN); an agent token may use only "
                                            "/v1/agents/<its agent>/schedule and /api/schedules."))
        try:  # a message to an agent costs its daily budget: counted (or refused) before it goes
            await run_in_threadpool(count_send, core, request.method, request.url.path)
        except PromptYoSelfError as exc:
            return error_response(exc)
        status, headers, body, close = await proxy.forward(
            request.method, request.url.path, request.url.query.encode(), request.headers.raw, request.stream()
        )
        response = StreamingResponse(body, status_code=status, background=BackgroundTask(close))
        response.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        return response

    app.add_api_route("/v1/{rest:path}", forward, include_in_schema=False,
                      methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    app.router.on_shutdown.append(proxy.aclose)


def build_rest_app(core: Core, *, letta_proxy: bool | None = None) -> FastAPI:
    """The REST app over ``core`` (blocking store and Letta calls run in the thread pool).

    ``letta_proxy`` (default: ``PROMPTYOSELF_LETTA_PROXY``) adds the pass-through to Letta for every
    other ``/v1/...`` route, so ``Letta(base_url=<this service>)`` serves the whole SDK."""
    api = LettaSchedules(core)
    app = RestApp(
        title="PromptYoSelf",
        summary="Scheduled prompts for Letta agents; Letta's scheduling API for self-hosted servers.",
        docs_url=None,
        redoc_url=None,
        middleware=bearer_middleware(core.settings, agent_resolver(core)),
    )

    app.add_exception_handler(RequestValidationError, _validation_response)
    app.add_exception_handler(StarletteHTTPException, _http_response)
    _mount_docs(app)

    async def call(fn: Any, *args: Any, check: Any = None, **kw: Any) -> JSONResponse:
        """``fn(*args, **kw)`` (awaited when it is a coroutine function, else in the thread pool),
        after ``check()`` (what an agent token may do: it raises Forbidden/NotFound before anything is
        stored; awaited when it reads the store)."""
        try:
            if check is not None and inspect.isawaitable(checked := check()):
                await checked
            if inspect.iscoroutinefunction(fn):  # the core's async operations
                return JSONResponse(await fn(*args, **kw))
            return JSONResponse(await run_in_threadpool(functools.partial(fn, *args, **kw)))
        except PromptYoSelfError as exc:
            return error_response(exc)
        except Exception:  # a bug: the details in the log only
            log.exception("REST call %s failed", getattr(fn, "__name__", fn))
            return JSONResponse(error_body("Internal error; the service log has the details. GET /healthz to "
                                           "check the service.", "internal"), 500)

    def as_caller(request: Request, named: str | None, header: str | None) -> tuple[Any, Any]:
        """The agent a route acts for (the token's agent for an agent token), and the check that an
        agent token names no other agent in the body, the query or ``X-Agent-Id`` (403)."""
        who = caller_agent(request)

        def check() -> None:
            agent_tokens.own_agent(who, named)
            agent_tokens.own_agent(who, header)

        return (named if who is None else who), check

    def mine(request: Request, agent_id: str) -> Any:
        """An agent token may use the Letta routes of its own agent only (403 otherwise)."""
        who = caller_agent(request)
        return lambda: agent_tokens.own_agent(who, agent_id)

    def own(request: Request, schedule_id: ScheduleId) -> Any:
        """An agent token may touch its own agent's schedules only (404 for another agent's)."""
        who = caller_agent(request)
        return lambda: agent_tokens.own_schedule(core, who, schedule_id)

    # ---- Letta's scheduling API -----------------------------------------------------------------

    @app.post("/v1/agents/{agent_id}/schedule", tags=["letta"], summary="Schedule a message (Letta API)")
    async def letta_create(agent_id: str, request: Request) -> JSONResponse:
        who = caller_agent(request)
        if who is not None and who != agent_id:
            return error_response(Forbidden(f"This agent token acts for {who} only; it cannot act for "
                                            f"{agent_id[:100]}."))
        try:
            body = json.loads(await request.body() or b"null")
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return JSONResponse(error_body("The body is not valid JSON (or is nested too deep).", "invalid_argument"),
                                400)
        return await call(api.create, agent_id, body, by_agent=who is not None)

    @app.get("/v1/agents/{agent_id}/schedule", tags=["letta"], summary="List scheduled messages (Letta API)")
    async def letta_list(request: Request, agent_id: str, after: str | None = None,
                         limit: str | None = None) -> JSONResponse:
        return await call(api.list, agent_id, after=after, limit=limit, check=mine(request, agent_id))

    @app.get("/v1/agents/{agent_id}/schedule/{scheduled_message_id}", tags=["letta"],
             summary="Retrieve a scheduled message (Letta API)")
    async def letta_retrieve(request: Request, agent_id: str, scheduled_message_id: str) -> JSONResponse:
        return await call(api.retrieve, agent_id, scheduled_message_id, check=mine(request, agent_id))

    @app.delete("/v1/agents/{agent_id}/schedule/{scheduled_message_id}", tags=["letta"],
                summary="Delete a scheduled message (Letta API)")
    async def letta_delete(request: Request, agent_id: str, scheduled_message_id: str) -> JSONResponse:
        return await call(api.delete, agent_id, scheduled_message_id, check=mine(request, agent_id))

    # ---- PromptYoSelf's own routes (the MCP tools) --------------------------------------------------

    @app.post("/api/schedules/time", tags=["schedules"], summary="Schedule a one-time prompt")
    async def schedule_time(request: Request, req: TimeRequest,
                            x_agent_id: str | None = AGENT_HEADER) -> JSONResponse:
        agent, check = as_caller(request, req.agent_id, x_agent_id)
        return await call(core.scheduling.schedule_time, req.prompt, req.time, req.options(agent),
                          ctx=_context(x_agent_id, request), check=check)

    @app.post("/api/schedules/cron", tags=["schedules"], summary="Schedule a prompt on a rule (words, RRULE, cron)")
    async def schedule_cron(request: Request, req: CronRequest,
                            x_agent_id: str | None = AGENT_HEADER) -> JSONResponse:
        agent, check = as_caller(request, req.agent_id, x_agent_id)
        return await call(core.scheduling.schedule_cron, req.prompt, req.cron, req.options(agent),
                          ctx=_context(x_agent_id, request), check=check)

    @app.post("/api/schedules/every", tags=["schedules"], summary="Schedule a prompt every interval")
    async def schedule_every(request: Request, req: EveryRequest,
                             x_agent_id: str | None = AGENT_HEADER) -> JSONResponse:
        agent, check = as_caller(request, req.agent_id, x_agent_id)
        return await call(core.scheduling.schedule_every, req.prompt, req.every, req.options(agent),
                          start_at=req.start_at, max_repetitions=req.max_repetitions,
                          ctx=_context(x_agent_id, request), check=check)

    @app.get("/api/schedules", tags=["schedules"], summary="List schedules")
    async def list_schedules(
        request: Request,
        agent_id: str | None = None,
        include_cancelled: bool = False,
        limit: int = Query(50, ge=1),
        offset: int = Query(0, ge=0),
        x_agent_id: str | None = AGENT_HEADER,
    ) -> JSONResponse:
        agent, check = as_caller(request, agent_id, x_agent_id)
        return await call(core.scheduling.list_schedules, agent_id=agent, include_cancelled=include_cancelled,
                          limit=limit, offset=offset, ctx=_context(x_agent_id, request), check=check)

    @app.get("/api/targets", tags=["schedules"], summary="The installed delivery targets and their readiness")
    async def targets() -> JSONResponse:
        return await call(core.targets)

    @app.get("/api/history", tags=["schedules"], summary="Delivery history")
    async def history(request: Request, schedule_id: ScheduleId | None = None, agent_id: str | None = None,
                      limit: int = Query(20, ge=1), x_agent_id: str | None = AGENT_HEADER) -> JSONResponse:
        agent, named = as_caller(request, agent_id, x_agent_id)
        by_id = own(request, schedule_id) if schedule_id is not None else None

        async def check() -> None:
            named()
            if by_id is not None:
                await by_id()

        return await call(core.scheduling.history, schedule_id=schedule_id, agent_id=agent, limit=limit,
                          ctx=_context(x_agent_id, request), check=check)

    @app.post("/api/schedules/{schedule_id}/pause", tags=["schedules"], summary="Pause a schedule")
    async def pause(request: Request, schedule_id: ScheduleId) -> JSONResponse:
        return await call(core.scheduling.pause, schedule_id, check=own(request, schedule_id))

    @app.post("/api/schedules/{schedule_id}/resume", tags=["schedules"], summary="Resume a paused schedule")
    async def resume(request: Request, schedule_id: ScheduleId) -> JSONResponse:
        return await call(core.scheduling.resume, schedule_id, check=own(request, schedule_id))

    @app.post("/api/schedules/{schedule_id}/overlap", tags=["schedules"],
              summary="Change a schedule's overlap policy (skip, queue or allow)")
    async def set_overlap(request: Request, schedule_id: ScheduleId, body: OverlapBody) -> JSONResponse:
        return await call(core.scheduling.set_overlap, schedule_id, body.overlap, check=own(request, schedule_id))

    @app.delete("/api/schedules/{schedule_id}", tags=["schedules"], summary="Cancel a schedule")
    async def cancel(request: Request, schedule_id: ScheduleId, agent_id: str | None = None) -> JSONResponse:
        """Cancel; with ``agent_id`` (or an agent token) only that agent's schedule (404 otherwise)."""
        who = caller_agent(request)
        return await call(native_tools.cancel_own, core, schedule_id, who or agent_id,
                          check=lambda: agent_tokens.own_agent(who, agent_id))

    # ---- the operator's policy (docs/configuration.md) -----------------------------------------

    def operator_only(request: Request) -> Any:
        """The policy is the operator's: an agent token gets 403."""
        who = caller_agent(request)

        def check() -> None:
            if who is not None:
                raise Forbidden("The policy is the operator's: use the operator token (PROMPTYOSELF_HTTP_TOKEN); "
                                f"this agent token acts for {who} only.")

        return check

    @app.get("/api/policy", tags=["operator"], summary="The guardrails every writer enforces, and their sources")
    async def policy_show(request: Request) -> JSONResponse:
        return await call(core.operator.policy_show, check=operator_only(request))

    @app.put("/api/policy", tags=["operator"], summary="Set guardrails (operator)")
    async def policy_set(request: Request, req: PolicyRequest) -> JSONResponse:
        return await call(core.operator.policy_set, req.model_dump(exclude_unset=True), check=operator_only(request))

    if core.settings.letta_proxy if letta_proxy is None else letta_proxy:
        _mount_proxy(app, core)
    return app
