"""The operator console: server-rendered HTML at ``/`` and ``/console/...`` of ``promptyoself serve``.

Plain forms, no JavaScript; Jinja2 templates shipped in ``faces/templates/console``. Like every other
face it parses a request, makes one call into the core (in the thread pool) and renders the result.

Access (docs/console.md):

* With ``PROMPTYOSELF_HTTP_TOKEN`` set, every page and action needs a session: the sign-in form takes
  the token and sets a cookie (HttpOnly, SameSite=Strict, 12 hours) holding the session id signed
  with itsdangerous (a key derived from the token), never the token. The session itself lives in the
  database (promptyoself/core/console_sessions.py): signing out ends it in every process and across
  restarts, and "Sign out everywhere" ends every session. ``Authorization: Bearer <token>`` also
  works (scripts). Failed sign-ins count against the service's shared limit of wrong guesses per
  client (``http_auth.GuessLimiter``). Without a token the service is open on loopback like its
  other routes, and the console issues a session cookie on the first page (signed with a key of this
  process, not stored).
* Every form that changes something carries a CSRF token bound to the session (its itsdangerous
  signature under a salt of its own), and a POST whose ``Origin`` names another host is refused.
* Links back (``back``, ``next``) are only same-site paths (``local_path``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode
from zoneinfo import ZoneInfo

from itsdangerous import BadSignature, Signer, URLSafeTimedSerializer
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from promptyoself.core import alerts as core_alerts
from promptyoself.core.console_sessions import ConsoleSessions
from promptyoself.core.operations import Core
from promptyoself.core.operator import STATES
from promptyoself.core.results import receipt_summary
from promptyoself.core.timeline import (
    DENSE,
    MAX_AGENTS,
    MAX_ATTEMPTS,
    MAX_RUNS,
    MAX_SCHEDULES,
    recent_deliveries,
    upcoming_runs,
)
from promptyoself.errors import PromptYoSelfError
from promptyoself.faces.http_auth import GuessLimiter, client_address, http_token
from promptyoself.faces.timeline_svg import bars_chart, runs_chart

log = logging.getLogger(__name__)

SESSION_COOKIE = "pys_console"
FLASH_COOKIE = "pys_flash"
SESSION_SECONDS = 12 * 3600
MAX_FORM_BYTES = 16_384
ACTIONS = ("pause", "resume", "run", "cancel", "approve", "reject")
PAGE = 50
AGENTS_PAGE = 100
FAILED_SIGN_IN_DELAY = 1.0

Handler = Callable[[Request], Awaitable[Response]]


def is_console_path(path: str) -> bool:
    """The paths the console serves (everything else goes to the service's other routes)."""
    return path == "/" or path == "/console" or path.startswith("/console/")


def when(value: object, zone: str | None = None) -> str:
    """An ISO 8601 instant as the console shows it: ``2026-06-15 14:00:05 +02:00`` (seconds, its
    offset), in the IANA ``zone`` when given (a schedule's)."""
    if not value:
        return "-"
    try:
        dt = datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    if dt.tzinfo is None:
        return str(value)
    if zone:
        try:
            dt = dt.astimezone(ZoneInfo(zone))
        except (ValueError, KeyError, OSError, OverflowError):  # an unknown zone, or past 9999 there: as stored
            pass
    offset = dt.strftime("%z")
    return f"{dt:%Y-%m-%d %H:%M:%S} {offset[:3]}:{offset[3:]}"


def _loopback_host(host: str) -> bool:
    """Whether a ``Host`` header names this machine's loopback interface (any port)."""
    name = host.strip().lower()
    if name.startswith("["):
        name = name[: name.find("]") + 1]
    else:
        name = name.rsplit(":", 1)[0] if name.count(":") == 1 else name
    return name in ("127.0.0.1", "localhost", "[::1]", "::1")


def local_path(target: str | None, default: str = "/") -> str:
    """``target`` if it is a path of this site, else ``default``: exactly one leading ``/``, no ``\\``
    anywhere, and no control or white-space character, looked at as sent and percent-decoded (up to
    three times), since browsers drop a tab or a newline and read ``/%09/evil.example`` as
    ``//evil.example``. Bounded: longer than 2,000 characters is refused too."""
    if not target or len(target) > 2000:
        return default
    seen = target
    for _ in range(4):
        if not seen.startswith("/") or seen.startswith("//") or "\\" in seen:
            return default
        if any(ch.isspace() or ord(ch) < 32 or 127 <= ord(ch) < 160 for ch in seen):
            return default
        decoded = unquote(seen)
        if decoded == seen:
            return target
        seen = decoded
    return default


class Console:
    """The console's ASGI app over one ``Core``."""

    def __init__(self, core: Core, limiter: GuessLimiter | None = None) -> None:
        self.core = core
        self.token = http_token(core.settings)
        self.limiter = limiter or GuessLimiter()
        # Cookies are signed with a key derived from the token (every process serving the database reads
        # them; they end when the token changes); without a token, with a key of this process.
        self.key = (hmac.new(self.token.encode(), b"promptyoself-console-session", hashlib.sha256).digest()
                    if self.token else secrets.token_bytes(32))
        self.cookies = URLSafeTimedSerializer(self.key, salt="promptyoself-console-session")
        self.csrf_signer = Signer(self.key, salt="promptyoself-console-csrf")
        self.sessions = ConsoleSessions(core, timedelta(seconds=SESSION_SECONDS))
        self.env = Environment(loader=PackageLoader("promptyoself.faces", "templates/console"),
                               autoescape=select_autoescape(default=True, default_for_string=True))
        self.env.filters["when"] = when
        self.env.filters["receipt"] = receipt_summary  # a history row's receipt in one line (issue 43)
        routes = [
            Route("/", self._guard(self.index)),
            Route("/console", self._guard(self.index)),
            Route("/console/login", self.login_form, methods=["GET"]),
            Route("/console/login", self.login, methods=["POST"]),
            Route("/console/logout", self._guard(self.logout), methods=["POST"]),
            Route("/console/logout-all", self._guard(self.logout_all), methods=["POST"]),
            Route("/console/agents", self._guard(self.agents)),
            Route("/console/timeline", self._guard(self.timeline)),
            Route("/console/agents/{agent_id:path}", self._guard(self.agent)),
            Route("/console/tokens", self._guard(self.tokens), methods=["GET"]),
            Route("/console/tokens/{action}", self._guard(self.token_action), methods=["POST"]),
            Route("/console/policy", self._guard(self.policy), methods=["GET"]),
            Route("/console/policy", self._guard(self.set_policy), methods=["POST"]),
            Route("/console/alerts/dismiss", self._guard(self.dismiss_alerts), methods=["POST"]),
            Route("/console/schedules/{sid:int}", self._guard(self.schedule)),
            Route("/console/schedules/{sid:int}/cancel", self._guard(self.confirm_cancel), methods=["GET"]),
            Route("/console/schedules/{sid:int}/{action}", self._guard(self.act), methods=["POST"]),
            Route("/console/{rest:path}", self._guard(self.not_found), methods=["GET", "POST"]),
        ]
        self.app = Starlette(routes=routes)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)

    # ---- sessions and CSRF ------------------------------------------------------------------

    def new_session(self) -> str:
        """A signed cookie for a new session: recorded in the database when a token guards the console
        (sign-out then holds everywhere); without a token, only signed (any local user may open one)."""
        session_id = self.sessions.open() if self.token else secrets.token_urlsafe(18)
        return self.cookies.dumps(session_id)

    def _signed_id(self, cookie: str | None) -> str | None:
        """The session id in ``cookie`` when this console signed it less than 12 hours ago."""
        if not cookie or len(cookie) > 500:
            return None
        try:
            value = self.cookies.loads(cookie, max_age=SESSION_SECONDS)
        except BadSignature:  # SignatureExpired is one
            return None
        return value if isinstance(value, str) and value else None

    async def session_id(self, cookie: str | None) -> str | None:
        """The session's id when ``cookie`` is one this console signed, it has not expired and (with a
        token) it has not been signed out of (the database says, whichever process opened it)."""
        session = self._signed_id(cookie)
        if session is None or self.token is None:
            return session
        return session if await run_in_threadpool(self.sessions.alive, session) else None

    def csrf_for(self, session: str) -> str:
        return self.csrf_signer.get_signature(session).decode()

    def csrf_ok(self, session: str | None, given: str) -> bool:
        return bool(session and given and len(given) < 200
                    and self.csrf_signer.verify_signature(session.encode(), given.encode()))

    def _bearer_ok(self, request: Request) -> bool:
        """A bearer token that is the service's (a wrong one counts as a guess); raises ``_Throttled``
        when this client has made too many wrong guesses to have another looked at now."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if not (self.token and scheme.lower() == "bearer" and given.strip()):
            return False
        return self._check_token(request, given.strip())

    def _check_token(self, request: Request, given: str) -> bool:
        assert self.token is not None
        client = client_address(request.scope)
        if not self.limiter.take(client):
            raise _Throttled(self.limiter.wait_s(client))
        if hmac.compare_digest(given.encode(), self.token.encode()):
            self.limiter.give_back(client)
            return True
        return False

    def _cookie(self, response: Response, request: Request, value: str) -> None:
        response.set_cookie(SESSION_COOKIE, value, max_age=SESSION_SECONDS, path="/", httponly=True,
                            samesite="strict", secure=request.url.scheme == "https")

    def _guard(self, handler: Handler) -> Handler:
        """Let the request through only with a session (or the bearer token); POSTs also need the
        session's CSRF token and no foreign ``Origin``."""

        async def guarded(request: Request) -> Response:
            if self.token is None and not _loopback_host(request.headers.get("host", "")):
                # open console: only under a loopback name, so a page of another site whose name was
                # pointed at 127.0.0.1 (DNS rebinding) cannot read it, CSRF tokens included
                return self._refuse(request, 403, "Without PROMPTYOSELF_HTTP_TOKEN the console answers only at "
                                    "127.0.0.1, localhost or [::1].")
            try:
                session = await self.session_id(request.cookies.get(SESSION_COOKIE))
                bearer = session is None and self._bearer_ok(request)
            except _Throttled as exc:
                return self._throttled(request, exc.wait)
            except PromptYoSelfError as exc:
                return self._refuse(request, 503, f"Cannot check the session: {exc.message}")
            fresh: str | None = None
            if session is None and not bearer:
                if self.token:
                    if request.method != "GET":
                        return self._refuse(request, 401, "Sign in first.")
                    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                    return RedirectResponse("/console/login?" + urlencode({"next": target}), status_code=303)
                if request.method != "GET":  # open console: the session comes with the first page
                    return self._refuse(request, 403, "This form has expired; reload the page.")
                fresh = self.new_session()
                session = self._signed_id(fresh)
            request.state.session = session
            if request.method == "POST" and not bearer:
                origin = request.headers.get("origin")
                host = request.headers.get("host", "")
                if origin and origin.split("://", 1)[-1] != host:  # "null" too: our forms post same-origin
                    return self._refuse(request, 403, "Cross-site request refused.")
                form = await self._form(request)
                if form is None:
                    return self._refuse(request, 413, "The form is too large.")
                if not self.csrf_ok(session, form.get("csrf", "")):
                    return self._refuse(request, 403, "Missing or wrong CSRF token: reload the page and try again.")
            response = await handler(request)
            if fresh is not None:
                self._cookie(response, request, fresh)
            return response

        return guarded

    @staticmethod
    async def _form(request: Request) -> dict[str, str] | None:
        """The url-encoded form of a POST (read once, kept on the request), None when too large."""
        cached = getattr(request.state, "form", None)
        if cached is not None:
            return dict(cached)
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                return None
        parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        form = {k: v[0] for k, v in parsed.items()}
        request.state.form = form
        return form

    def _refuse(self, request: Request, status: int, message: str) -> Response:
        return self.page(request, "error.html", {"message": message}, status=status)

    def _throttled(self, request: Request, wait: int) -> Response:
        response = self._refuse(request, 429, "Too many wrong tokens from this address; wait a second and try again.")
        response.headers["retry-after"] = str(wait)
        return response

    # ---- rendering --------------------------------------------------------------------------

    def page(self, request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        session = getattr(request.state, "session", None)
        flash = request.cookies.get(FLASH_COOKIE)
        values = {
            "csrf": self.csrf_for(session) if session else "",
            "signed_in": session is not None,
            "token_required": self.token is not None,
            "flash": unquote(flash) if flash else None,
            "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            **context,
        }
        response = HTMLResponse(self.env.get_template(name).render(**values), status_code=status,
                                headers={"cache-control": "no-store", "x-frame-options": "DENY",
                                         "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; "
                                         "img-src 'self'; form-action 'self'; frame-ancestors 'none'",
                                         "referrer-policy": "same-origin"})
        if flash:
            response.delete_cookie(FLASH_COOKIE, path="/")
        return response

    @staticmethod
    def _redirect(request: Request, target: str, message: str) -> Response:
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(FLASH_COOKIE, quote(message[:500]), max_age=60, path="/", httponly=True,
                            samesite="strict", secure=request.url.scheme == "https")
        return response

    async def _overview(self) -> dict[str, Any]:
        """The banner of every page: health, today's counters and the guardrails."""
        core = self.core
        health = await core.health()
        try:
            today = await core.operator.today()
        except PromptYoSelfError:  # the database is down: the banner says so (health), the counters wait
            today = {"day_started": None, "delivered": 0, "failed": 0, "missed": 0, "over_budget": 0, "retry": 0}
        try:
            raised: dict[str, Any] = dict(await run_in_threadpool(core_alerts.banner, core))
        except PromptYoSelfError:
            raised = {"unseen": 0, "alerts": []}
        return {"health": health, "today": today, "guardrails": health.get("guardrails") or {}, "raised": raised}

    # ---- pages ------------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        q = request.query_params
        agent = (q.get("agent") or "").strip() or None
        state = (q.get("state") or "live").strip()
        try:
            offset = max(int(q.get("offset") or 0), 0)
        except ValueError:
            offset = 0
        context = await self._overview()
        try:
            listed = await self.core.operator.console_schedules(agent_id=agent, state=state, limit=PAGE,
                                                                offset=offset)
        except PromptYoSelfError as exc:
            return self.page(request, "error.html", {**context, "message": exc.message}, status=400)
        known = await self.core.operator.console_agent_ids()
        context.update(listed=listed, agent=agent or "", state=state, known_agents=known,
                       states=("live", *STATES, "all"), offset=offset, page=PAGE)
        return self.page(request, "index.html", context)

    async def agents(self, request: Request) -> Response:
        context = await self._overview()
        try:
            offset = max(int(request.query_params.get("offset") or 0), 0)
        except ValueError:
            offset = 0
        agents, total = await self.core.operator.console_agents(AGENTS_PAGE, offset)
        context.update(agents=agents, total=total, offset=offset, page=AGENTS_PAGE)
        return self.page(request, "agents.html", context)

    async def agent(self, request: Request) -> Response:
        agent = request.path_params["agent_id"]
        context = await self._overview()
        try:
            listed = await self.core.operator.console_schedules(agent_id=agent, state="all", limit=PAGE)
            usage = await self.core.operator.agent_usage(agent)
            today = await self.core.operator.today(agent)
            hist = await self.core.scheduling.history(agent_id=agent, limit=20)
        except PromptYoSelfError as exc:
            return self.page(request, "error.html", {**context, "message": exc.message}, status=400)
        context.update(agent=agent, listed=listed, usage=usage, agent_today=today, history=hist["deliveries"])
        return self.page(request, "agent.html", context)

    async def timeline(self, request: Request) -> Response:
        """Two charts (inline SVG): every agent's runs over the next 7 days, and the deliveries per hour
        over the last 24 by outcome; ``?agent=`` for one agent."""
        agent = (request.query_params.get("agent") or "").strip()[:100] or None
        context = await self._overview()
        now = self.core.now()
        try:
            upcoming = await upcoming_runs(self.core, now, agent)
            recent = await recent_deliveries(self.core, now, agent)
        except PromptYoSelfError as exc:
            return self.page(request, "error.html", {**context, "message": exc.message}, status=503)
        tz = self.core.settings.timezone
        context.update(agent=agent or "", zone=tz.key, runs=runs_chart(upcoming, tz), bars=bars_chart(recent, tz),
                       max_runs=MAX_RUNS, dense=DENSE, max_agents=MAX_AGENTS, max_schedules=MAX_SCHEDULES,
                       max_attempts=MAX_ATTEMPTS)
        return self.page(request, "timeline.html", context)

    async def schedule(self, request: Request) -> Response:
        context = await self._overview()
        try:
            view = await self.core.operator.console_schedule(request.path_params["sid"])
        except PromptYoSelfError as exc:
            return self.page(request, "error.html", {**context, "message": exc.message}, status=404)
        context["view"] = view
        return self.page(request, "schedule.html", context)

    async def confirm_cancel(self, request: Request) -> Response:
        context = await self._overview()
        try:
            view = await self.core.operator.console_schedule(request.path_params["sid"])
        except PromptYoSelfError as exc:
            return self.page(request, "error.html", {**context, "message": exc.message}, status=404)
        context.update(view=view, back=local_path(request.query_params.get("back")))
        return self.page(request, "confirm_cancel.html", context)

    async def act(self, request: Request) -> Response:
        action = request.path_params["action"]
        sid = request.path_params["sid"]
        form = await self._form(request) or {}
        back = local_path(form.get("back"))
        if action not in ACTIONS:
            return self._refuse(request, 404, f"No action {action!r}.")
        if action == "cancel" and form.get("confirm") != "yes":
            return RedirectResponse(f"/console/schedules/{sid}/cancel?" + urlencode({"back": back}), status_code=303)
        core = self.core
        call: Callable[[object], Awaitable[Any]] = {
            "pause": core.scheduling.pause, "resume": core.scheduling.resume, "run": core.operator.run_now,
            "cancel": core.scheduling.cancel, "approve": core.operator.approve, "reject": core.operator.reject}[action]
        try:
            result = await call(sid)
        except PromptYoSelfError as exc:
            return self._redirect(request, back, f"error: {exc.message}")
        log.info("console: %s schedule %s", action, sid)
        return self._redirect(request, back, str(result.get("message") or f"{action}: done"))

    async def dismiss_alerts(self, request: Request) -> Response:
        """The alerts banner's Dismiss (its CSRF token checked by ``_guard``): one alert, or all."""
        form = await self._form(request) or {}
        back = local_path(form.get("back"))
        one = (form.get("id") or "").strip()
        result = await run_in_threadpool(core_alerts.dismiss, self.core, [one] if one else None)
        return self._redirect(request, back, result["message"])

    async def tokens(self, request: Request, minted: dict[str, Any] | None = None) -> Response:
        """Agent tokens: mint, rotate, revoke (``promptyoself.core.agent_tokens``; the CLI's `token`)."""
        from promptyoself.core import agent_tokens

        listed = await agent_tokens.listing(self.core, None, include_revoked=True)
        return self.page(request, "tokens.html", {"tokens": listed["tokens"], "minted": minted})

    async def token_action(self, request: Request) -> Response:
        from promptyoself.core import agent_tokens

        action = request.path_params["action"]
        form = await self._form(request) or {}
        try:
            if action in ("mint", "rotate"):
                made = await agent_tokens.mint(self.core, form.get("agent_id"), rotate=action == "rotate")
                log.info("console: %s an agent token for %s", action, made["agent_id"])
                return await self.tokens(request, minted=made)  # shown once, on this page: never in a redirect
            if action == "revoke":
                done = await agent_tokens.revoke(self.core, token_id=form.get("id"))
                log.info("console: revoked agent token %s", form.get("id"))
                return self._redirect(request, "/console/tokens", done["message"])
        except PromptYoSelfError as exc:
            return self._redirect(request, "/console/tokens", f"error: {exc.message}")
        return self._refuse(request, 404, f"No action {action[:40]!r}.")

    async def policy(self, request: Request, error: str | None = None, status: int = 200) -> Response:
        context = await self._overview()
        shown = await self.core.operator.policy_show()
        context.update(policy=shown, error=error)
        return self.page(request, "policy.html", context, status=status)

    async def set_policy(self, request: Request) -> Response:
        """The policy form (its CSRF token checked by ``_guard``): only the values that changed are set."""
        form = await self._form(request) or {}
        current = await self.core.operator.policy_show()
        changes = {e["name"]: form[e["name"]].strip() for e in current["policy_entries"]
                   if e["name"] in form and form[e["name"]].strip() != str(e["value"])}
        if not changes:
            return self._redirect(request, "/console/policy", "Nothing changed.")
        try:
            result = await self.core.operator.policy_set(changes)
        except PromptYoSelfError as exc:
            return await self.policy(request, error=exc.message, status=400)
        log.info("console: policy set %s", ", ".join(sorted(changes)))
        return self._redirect(request, "/console/policy", result["message"])

    async def not_found(self, request: Request) -> Response:
        return self._refuse(request, 404, "No such page. Start at the schedules.")

    # ---- signing in and out -----------------------------------------------------------------

    async def login_form(self, request: Request, error: str | None = None, status: int = 200) -> Response:
        target = local_path(request.query_params.get("next"))
        try:
            signed_in = await self.session_id(request.cookies.get(SESSION_COOKIE))
        except PromptYoSelfError as exc:
            return self._refuse(request, 503, f"Cannot check the session: {exc.message}")
        if self.token is None or signed_in:
            return RedirectResponse(target, status_code=303)
        return self.page(request, "login.html", {"next": target, "error": error}, status=status)

    async def login(self, request: Request) -> Response:
        form = await self._form(request)
        if form is None:
            return self._refuse(request, 413, "The form is too large.")
        target = local_path(form.get("next"))
        if self.token is None:
            return RedirectResponse(target, status_code=303)
        given = form.get("token", "").strip()
        try:
            right = bool(given) and self._check_token(request, given)
        except _Throttled as exc:
            return self._throttled(request, exc.wait)
        if not right:
            log.warning("console: a sign-in with a wrong token from %s", client_address(request.scope))
            await asyncio.sleep(FAILED_SIGN_IN_DELAY)  # guessing the token costs time
            return self.page(request, "login.html", {"next": target, "error": "That is not the service's token."},
                             status=401)
        try:
            cookie = await run_in_threadpool(self.new_session)
        except PromptYoSelfError as exc:
            return self._refuse(request, 503, f"Cannot open a session: {exc.message}")
        response = RedirectResponse(target, status_code=303)
        self._cookie(response, request, cookie)
        return response

    async def logout(self, request: Request) -> Response:
        """End this browser's session: its row goes, so the cookie (and its CSRF token) stop working in
        every process serving the database, and after a restart."""
        session = getattr(request.state, "session", None)
        if session and self.token:
            await run_in_threadpool(self.sessions.close, session)
        response = RedirectResponse("/console/login" if self.token else "/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    async def logout_all(self, request: Request) -> Response:
        """End every console session (a cookie left on another machine, a shared browser)."""
        ended = await run_in_threadpool(self.sessions.close_all) if self.token else 0
        log.info("console: signed out of every session (%d)", ended)
        response = self._redirect(request, "/console/login" if self.token else "/",
                                  f"Signed out of {ended} console session{'s' if ended != 1 else ''}.")
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response


class _Throttled(Exception):
    def __init__(self, wait: int) -> None:
        super().__init__(wait)
        self.wait = wait


def build_console(core: Core, limiter: GuessLimiter | None = None) -> Console:
    return Console(core, limiter)
