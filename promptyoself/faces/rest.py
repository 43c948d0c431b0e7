"""PromptYoSelf's REST face: Letta's scheduling routes, as the ``letta-client`` SDK expects them.

``build_rest_app(core)`` returns an ASGI app (Starlette: it is already a dependency through FastMCP;
plain routes keep the Letta shapes exact, written by ``core.letta_schedules``). The always-on
``serve`` command mounts it next to ``/mcp``. Every route needs ``Authorization: Bearer
<PROMPTYOSELF_HTTP_TOKEN>`` when that token is set (401 otherwise); the Letta password is NOT
accepted in its place.

Routes: ``POST``/``GET /v1/agents/{agent_id}/schedule``, ``GET``/``DELETE
/v1/agents/{agent_id}/schedule/{scheduled_message_id}``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

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


def build_rest_app(core: Core) -> Starlette:
    """The REST app over ``core`` (blocking store and Letta calls run in the thread pool)."""
    api = LettaSchedules(core)

    async def call(fn: Any, *args: Any, **kw: Any) -> JSONResponse:
        try:
            return JSONResponse(await run_in_threadpool(fn, *args, **kw))
        except PromptYoSelfError as exc:
            return error_response(exc)

    async def schedule_collection(request: Request) -> JSONResponse:
        agent_id = request.path_params["agent_id"]
        if request.method == "POST":
            try:
                body = json.loads(await request.body() or b"null")
            except ValueError:
                return JSONResponse({"detail": "The body is not valid JSON.", "code": "invalid_argument"}, 400)
            return await call(api.create, agent_id, body)
        q = request.query_params
        return await call(api.list, agent_id, after=q.get("after"), limit=q.get("limit"))

    async def schedule_item(request: Request) -> JSONResponse:
        agent_id = request.path_params["agent_id"]
        sid = request.path_params["scheduled_message_id"]
        if request.method == "DELETE":
            return await call(api.delete, agent_id, sid)
        return await call(api.retrieve, agent_id, sid)

    routes = [
        Route("/v1/agents/{agent_id}/schedule", schedule_collection, methods=["GET", "POST"]),
        Route("/v1/agents/{agent_id}/schedule/{scheduled_message_id}", schedule_item, methods=["GET", "DELETE"]),
    ]
    return Starlette(routes=routes, middleware=bearer_middleware(core.settings))
