"""PromptYoSelf's REST face: Letta's scheduling routes, and PromptYoSelf's own routes under ``/api``.

``build_rest_app(core)`` returns an ASGI app (FastAPI: the request models of ``/api`` give an
OpenAPI document at ``/openapi.json`` and 422s on malformed bodies for free; the Letta routes read
the raw body so that their shapes and 400s are exactly those of ``core.letta_schedules``). The
always-on ``serve`` command mounts it next to ``/mcp``. Every route, ``/openapi.json`` included,
needs ``Authorization: Bearer <PROMPTYOSELF_HTTP_TOKEN>`` when that token is set (401 otherwise);
the Letta password is NOT accepted in its place.

Letta routes: ``POST``/``GET /v1/agents/{agent_id}/schedule``, ``GET``/``DELETE
/v1/agents/{agent_id}/schedule/{scheduled_message_id}``.
Own routes (the MCP tools' operations, same JSON results): ``POST /api/schedules/time``,
``POST /api/schedules/cron``, ``POST /api/schedules/every``, ``GET /api/schedules``,
``GET /api/history``, ``POST /api/schedules/{id}/pause``, ``POST /api/schedules/{id}/resume``,
``DELETE /api/schedules/{id}`` (cancel).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI, Query, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from promptyoself.core import native_tools
from promptyoself.core.letta_schedules import LettaSchedules
from promptyoself.errors import (
    AgentNotFound,
    AgentRequired,
    InvalidArgument,
    LettaAuth,
    LettaUnavailable,
    NotFound,
    PromptYoSelfError,
    QuotaExceeded,
)
from promptyoself.faces.http_auth import bearer_middleware

if TYPE_CHECKING:
    from promptyoself.core.operations import Core

_STATUS: list[tuple[type[PromptYoSelfError], int]] = [
    (NotFound, 404),
    (AgentNotFound, 404),
    (InvalidArgument, 400),
    (AgentRequired, 400),
    (QuotaExceeded, 429),
    (LettaAuth, 502),
    (LettaUnavailable, 503),
]


def error_response(exc: PromptYoSelfError) -> JSONResponse:
    """Letta-style error body ``{"detail": msg}`` plus our ``code``."""
    status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
    return JSONResponse({"detail": exc.message, "code": exc.code}, status_code=status)


class _Common(BaseModel):
    prompt: str = Field(description="The text the agent receives.")
    agent_id: str | None = Field(None, description="Letta agent id; default: the configured/only agent.")
    timezone: str | None = Field(None, description="IANA zone, e.g. 'Europe/Berlin'; default PROMPTYOSELF_TIMEZONE.")
    idempotency_key: str | None = Field(None, description="Same key, same agent: the existing schedule is returned.")
    skip_validation: bool = Field(False, description="Do not check the agent exists on Letta.")
    catch_up: Literal["skip", "latest", "all"] | None = Field(
        None, description="Missed runs: 'latest' (default, one run for them), 'skip' or 'all' (at most 10).")


class TimeRequest(_Common):
    time: str = Field(description="'tomorrow at 9am', 'monday 9:00', 'in 2 hours', ISO 8601, ... "
                      "(docs/promptyoself-tools.md lists every form).")


class CronRequest(_Common):
    cron: str = Field(description="Words ('every weekday at 9'), an RFC 5545 RRULE, or 5-field cron "
                      "('0 9 * * MON-FRI').")


class EveryRequest(_Common):
    every: str = Field(description="Interval: '30s', '5m', '1h30m', 'PT15M' or seconds.")
    start_at: str | None = Field(None, description="First run (ISO 8601 or 'in 10m'); default now + every.")
    max_repetitions: int | None = Field(None, description="Stop after this many deliveries.")


def _mount_proxy(app: FastAPI, core: Core) -> None:
    """Every other ``/v1/...`` request goes to Letta (``core/passthrough.py``), streamed both ways."""
    from starlette.background import BackgroundTask
    from starlette.responses import StreamingResponse

    from promptyoself.core.passthrough import letta_passthrough

    proxy = letta_passthrough(core.settings)

    async def forward(request: Request) -> StreamingResponse:
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
    app = FastAPI(
        title="PromptYoSelf",
        summary="Scheduled prompts for Letta agents; Letta's scheduling API for self-hosted servers.",
        docs_url=None,
        redoc_url=None,
        middleware=bearer_middleware(core.settings),
    )

    async def call(fn: Any, *args: Any, **kw: Any) -> JSONResponse:
        try:
            return JSONResponse(await run_in_threadpool(fn, *args, **kw))
        except PromptYoSelfError as exc:
            return error_response(exc)

    # ---- Letta's scheduling API -----------------------------------------------------------------

    @app.post("/v1/agents/{agent_id}/schedule", tags=["letta"], summary="Schedule a message (Letta API)")
    async def letta_create(agent_id: str, request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError:
            return JSONResponse({"detail": "The body is not valid JSON.", "code": "invalid_argument"}, 400)
        return await call(api.create, agent_id, body)

    @app.get("/v1/agents/{agent_id}/schedule", tags=["letta"], summary="List scheduled messages (Letta API)")
    async def letta_list(agent_id: str, after: str | None = None, limit: str | None = None) -> JSONResponse:
        return await call(api.list, agent_id, after=after, limit=limit)

    @app.get("/v1/agents/{agent_id}/schedule/{scheduled_message_id}", tags=["letta"],
             summary="Retrieve a scheduled message (Letta API)")
    async def letta_retrieve(agent_id: str, scheduled_message_id: str) -> JSONResponse:
        return await call(api.retrieve, agent_id, scheduled_message_id)

    @app.delete("/v1/agents/{agent_id}/schedule/{scheduled_message_id}", tags=["letta"],
                summary="Delete a scheduled message (Letta API)")
    async def letta_delete(agent_id: str, scheduled_message_id: str) -> JSONResponse:
        return await call(api.delete, agent_id, scheduled_message_id)

    # ---- PromptYoSelf's own routes (the MCP tools) --------------------------------------------------

    @app.post("/api/schedules/time", tags=["schedules"], summary="Schedule a one-time prompt")
    async def schedule_time(req: TimeRequest) -> JSONResponse:
        return await call(core.schedule_time, req.prompt, req.time, agent_id=req.agent_id, timezone=req.timezone,
                          skip_validation=req.skip_validation, idempotency_key=req.idempotency_key,
                          catch_up=req.catch_up)

    @app.post("/api/schedules/cron", tags=["schedules"], summary="Schedule a prompt on a rule (words, RRULE, cron)")
    async def schedule_cron(req: CronRequest) -> JSONResponse:
        return await call(core.schedule_cron, req.prompt, req.cron, agent_id=req.agent_id, timezone=req.timezone,
                          skip_validation=req.skip_validation, idempotency_key=req.idempotency_key,
                          catch_up=req.catch_up)

    @app.post("/api/schedules/every", tags=["schedules"], summary="Schedule a prompt every interval")
    async def schedule_every(req: EveryRequest) -> JSONResponse:
        return await call(core.schedule_every, req.prompt, req.every, start_at=req.start_at,
                          max_repetitions=req.max_repetitions, agent_id=req.agent_id, timezone=req.timezone,
                          skip_validation=req.skip_validation, idempotency_key=req.idempotency_key,
                          catch_up=req.catch_up)

    @app.get("/api/schedules", tags=["schedules"], summary="List schedules")
    async def list_schedules(
        agent_id: str | None = None,
        include_cancelled: bool = False,
        limit: int = Query(50, ge=1),
        offset: int = Query(0, ge=0),
    ) -> JSONResponse:
        return await call(core.list_schedules, agent_id=agent_id, include_cancelled=include_cancelled,
                          limit=limit, offset=offset)

    @app.get("/api/history", tags=["schedules"], summary="Delivery history")
    async def history(schedule_id: int | None = None, agent_id: str | None = None,
                      limit: int = Query(20, ge=1)) -> JSONResponse:
        return await call(core.history, schedule_id=schedule_id, agent_id=agent_id, limit=limit)

    @app.post("/api/schedules/{schedule_id}/pause", tags=["schedules"], summary="Pause a schedule")
    async def pause(schedule_id: int) -> JSONResponse:
        return await call(core.pause, schedule_id)

    @app.post("/api/schedules/{schedule_id}/resume", tags=["schedules"], summary="Resume a paused schedule")
    async def resume(schedule_id: int) -> JSONResponse:
        return await call(core.resume, schedule_id)

    @app.delete("/api/schedules/{schedule_id}", tags=["schedules"], summary="Cancel a schedule")
    async def cancel(schedule_id: int, agent_id: str | None = None) -> JSONResponse:
        """Cancel; with ``agent_id`` only that agent's schedule (404 otherwise: the native tools use this)."""
        return await call(native_tools.cancel_own, core, schedule_id, agent_id)

    if core.settings.letta_proxy if letta_proxy is None else letta_proxy:
        _mount_proxy(app, core)
    return app
