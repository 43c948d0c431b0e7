"""Native Letta tools: small Python tools uploaded to Letta that call PromptYoSelf's REST API.

Letta runs them in its tool sandbox with ``LETTA_AGENT_ID`` set to the calling agent, plus the
agent's ``tool_exec_environment_variables``: ``install`` sets ``PROMPTYOSELF_SERVICE_URL`` and
``PROMPTYOSELF_SERVICE_TOKEN`` there, so the token never appears in tool source. That token is the
agent's own agent token (``promptyoself.core.agent_tokens``), minted afresh by each install: it acts
for that agent only, never as the operator's ``PROMPTYOSELF_HTTP_TOKEN`` (an agent cannot approve its
own schedules or touch another agent's). Works with a stock Letta (no stdio MCP, no HTTP MCP address
rules).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from promptyoself.core.results import CancelResult, NativeToolsInstalled, NativeToolsRemoved, TokenResult
from promptyoself.errors import InvalidArgument

if TYPE_CHECKING:
    from promptyoself.core.operations import Core

TAG = "promptyoself"
URL_VAR = "PROMPTYOSELF_SERVICE_URL"
TOKEN_VAR = "PROMPTYOSELF_SERVICE_TOKEN"

# Each tool is one self-contained function (Letta uploads a single function's source). A failure
# raises, so that Letta records the tool call as failed (tool status "error") with our error text.
_CALL = '''    import json
    import os
    import urllib.error
    import urllib.request

    NEXT_STEPS = (
        ("Cancel some with DELETE /api/schedules/{id} first.", "Cancel some with cancel_my_scheduled_prompt first."),
        ("GET /api/schedules?include_cancelled=true lists the ids.", "list_my_scheduled_prompts lists yours."),
        ("GET /api/schedules lists the ids.", "list_my_scheduled_prompts lists yours."),
    )
    base = os.environ.get("PROMPTYOSELF_SERVICE_URL", "").rstrip("/")
    if not base:
        raise RuntimeError("PROMPTYOSELF_SERVICE_URL is not set for this agent: run "
                           "`promptyoself letta install-tools --agent-id <this agent>`.")
    headers = {"Content-Type": "application/json"}
    if os.environ.get("PROMPTYOSELF_SERVICE_TOKEN"):
        headers["Authorization"] = "Bearer " + os.environ["PROMPTYOSELF_SERVICE_TOKEN"]
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read().decode()
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace")
        try:
            error = json.loads(text)
        except ValueError:
            error = None
        if isinstance(error, dict) and isinstance(error.get("error"), str):
            message = error["error"]
            for route, tool in NEXT_STEPS:  # name this agent's tools, not the REST routes
                message = message.replace(route, tool)
            raise RuntimeError(message + " (" + str(error.get("code")) + ")") from None
        raise RuntimeError("PromptYoSelf at " + base + " answered HTTP " + str(exc.code) + " " + text[:200]
                           + ": is PROMPTYOSELF_SERVICE_URL the `promptyoself serve` service?") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RuntimeError("Cannot reach PromptYoSelf at " + base + " (" + str(reason) + "): is "
                           "`promptyoself serve` running there?") from None
'''


def _schedule_tool(name: str, rule: str, option: tuple[str, str, str], summary: str, args: str, run: str) -> str:
    """The head of a scheduling tool: ``POST /api/schedules/<rule>`` with the prompt, the rule and the
    calling agent, plus the ``option`` (name, type, default) when the agent sets it."""
    opt, opt_type, default = option
    return f'''def {name}(prompt: str, {rule}: str, {opt}: {opt_type} = {default}) -> str:
    """{summary}

    Args:
{args}
    Returns:
        str: JSON with the schedule id and its {run} run. Raises an error saying what to change on failure.
    """
    method, path = "POST", "/api/schedules/{rule}"
    body = {{"prompt": prompt, "{rule}": {rule}, "agent_id": __import__("os").environ["LETTA_AGENT_ID"]}}
    if {opt}:
        body["{opt}"] = {opt}
'''


TOOLS: dict[str, str] = {
    "schedule_prompt_at": _schedule_tool(
        "schedule_prompt_at", "time", ("timezone", "str", '""'),
        "Schedule a prompt that will be sent to you (this agent) once, at a given time.\n\n"
        "    Use it to remind yourself later: the prompt arrives as a user message at that time.",
        "        prompt (str): The text you will receive.\n"
        "        time (str): When, e.g. 'tomorrow at 9am', 'monday 9:00', 'next friday at 14:30', 'in 2 hours', "
        "'2026-12-25 09:00 Europe/Berlin' or ISO 8601 '2026-12-25T09:00:00+01:00'. Check the answer's 'upcoming'.\n"
        "        timezone (str): IANA timezone for a time without an offset, e.g. 'Europe/Berlin'. Empty for the "
        "default.\n",
        "next",
    ),
    "schedule_prompt_cron": _schedule_tool(
        "schedule_prompt_cron", "cron", ("timezone", "str", '""'),
        "Schedule a prompt that will be sent to you (this agent) repeatedly, on a rule.",
        "        prompt (str): The text you will receive each time.\n"
        "        cron (str): The rule, in words ('every weekday at 9', 'every 2 weeks on tuesday and thursday at "
        "10:00', 'last friday of every month at 17:00'), an RFC 5545 RRULE, or 5-field cron ('0 9 * * MON-FRI'). "
        "Check the answer's 'upcoming' and 'description'.\n"
        "        timezone (str): IANA timezone the rule is read in, e.g. 'America/New_York'. Empty for the "
        "default.\n",
        "first",
    ),
    "schedule_prompt_every": _schedule_tool(
        "schedule_prompt_every", "every", ("max_repetitions", "int", "0"),
        "Schedule a prompt that will be sent to you (this agent) every fixed interval.",
        "        prompt (str): The text you will receive each time.\n"
        "        every (str): The interval, e.g. '30m', '1h30m', '1d'.\n"
        "        max_repetitions (int): Stop after this many deliveries; 0 for no limit.\n",
        "first",
    ),
    "list_my_scheduled_prompts": '''def list_my_scheduled_prompts() -> str:
    """List the prompts you (this agent) have scheduled that are still active or paused.

    Returns:
        str: JSON with the schedules (id, rule, next run, prompt text).
    """
    import urllib.parse

    method, body = "GET", None
    path = "/api/schedules?" + urllib.parse.urlencode({"agent_id": __import__("os").environ["LETTA_AGENT_ID"]})
''',
    "cancel_my_scheduled_prompt": '''def cancel_my_scheduled_prompt(schedule_id: int) -> str:
    """Cancel one of your scheduled prompts so it is not sent again.

    Args:
        schedule_id (int): The id shown by list_my_scheduled_prompts or returned when you scheduled it.

    Returns:
        str: JSON saying whether it was cancelled. Raises an error when there is no such schedule of yours.
    """
    import urllib.parse

    method, body = "DELETE", None
    path = "/api/schedules/" + str(int(schedule_id)) + "?" + urllib.parse.urlencode(
        {"agent_id": __import__("os").environ["LETTA_AGENT_ID"]}
    )
''',
}


def tool_sources() -> dict[str, str]:
    """Name -> full source of each native tool."""
    return {name: head + _CALL for name, head in TOOLS.items()}


def _agents(core: Core, agent_ids: list[str] | None, all_agents: bool) -> list[str]:
    if all_agents:
        return [str(a["id"]) for a in core.letta.list_all_agents()]
    if not agent_ids:
        raise InvalidArgument("Name the agents with --agent-id ID (repeatable) or use --all-agents.")
    return list(dict.fromkeys(agent_ids))


def check_service(service_url: str, token: str, timeout: float = 10.0) -> None:
    """Make sure ``service_url`` is PromptYoSelf's service with its REST API and accepts ``token``:
    ``GET /healthz`` answers health JSON, ``GET /api/schedules`` answers 200. Raises
    ``InvalidArgument`` saying what is wrong otherwise (nothing is installed then)."""
    import httpx

    base = service_url.rstrip("/")
    skip = " (or add --skip-check when only Letta's tool sandbox reaches this URL)"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(timeout=timeout) as http:
            health = http.get(f"{base}/healthz")
            api = http.get(f"{base}/api/schedules", params={"limit": 1}, headers=headers)
    except httpx.HTTPError as exc:
        raise InvalidArgument(
            f"Cannot reach PromptYoSelf at {base} ({type(exc).__name__}: {str(exc)[:120] or 'no answer'}). "
            f"Start the service (`promptyoself serve`, or `promptyoself service install`) and try again{skip}."
        ) from None
    try:
        looks_healthy = health.status_code in (200, 503) and "status" in health.json()
    except ValueError:
        looks_healthy = False
    if not looks_healthy:
        raise InvalidArgument(
            f"{base} is not PromptYoSelf's service: GET /healthz answered HTTP {health.status_code}. "
            f"Give --service-url the address of `promptyoself serve`{skip}."
        )
    if api.status_code == 401:
        raise InvalidArgument(
            f"PromptYoSelf at {base} refuses this token: it runs with another PROMPTYOSELF_HTTP_TOKEN. Run "
            "install-tools with the service's settings (its token file is read when PROMPTYOSELF_HTTP_TOKEN is not "
            "set; `promptyoself token show`)."
        )
    if api.status_code == 404:
        raise InvalidArgument(
            f"PromptYoSelf at {base} has no REST API (an MCP-only server, `serve --transport http`?). The native "
            "tools call /api/...: run `promptyoself serve` (no --transport) and point --service-url at it."
        )
    if api.status_code != 200:
        raise InvalidArgument(f"PromptYoSelf at {base} answered GET /api/schedules with HTTP {api.status_code}: "
                              f"{api.text[:200]}")


def install(
    core: Core, *, agent_ids: list[str] | None, all_agents: bool, service_url: str, check: bool = True
) -> NativeToolsInstalled:
    """Check the service (``check_service``, unless ``check`` is false), then upsert the tools, attach
    them to the agents and set the agents' tool environment (the service URL and token)."""
    from promptyoself.letta import tools_api

    if not service_url.startswith(("http://", "https://")):
        raise InvalidArgument("--service-url must be the http(s) URL Letta's tool sandbox reaches PromptYoSelf at.")
    token = core.settings.http_token.get_secret_value().strip() if core.settings.http_token else ""
    if check:
        check_service(service_url, token)
    from promptyoself.core import agent_tokens

    agents = _agents(core, agent_ids, all_agents)
    tools = {name: tools_api.upsert_tool(core.letta, src, tags=[TAG]) for name, src in tool_sources().items()}
    for agent in agents:
        env = tools_api.tool_env(core.letta, agent)
        env[URL_VAR] = service_url.rstrip("/")
        # its own; the earlier ones revoked (a CLI command's sync code: the store's verb run to its end)
        env[TOKEN_VAR] = asyncio.run(agent_tokens.mint(core, agent, rotate=True))["token"]
        tools_api.set_tool_env(core.letta, agent, env)
        for tool in tools.values():
            tools_api.attach_tool(core.letta, agent, str(tool["id"]))
    return {
        "status": "success",
        "tools": {name: t.get("id") for name, t in tools.items()},
        "agents": agents,
        "service_url": service_url.rstrip("/"),
        "message": f"Installed {len(tools)} tools on {len(agents)} agent(s), each with its own agent token "
                   "(its own schedules only; `promptyoself token list` shows them).",
    }


def uninstall(core: Core, *, agent_ids: list[str] | None, all_agents: bool) -> NativeToolsRemoved:
    """Detach the tools from the agents and drop our environment variables; with ``--all-agents``
    also delete the tools from Letta."""
    from promptyoself.letta import tools_api

    agents = _agents(core, agent_ids, all_agents)
    found = {name: tools_api.find_tool(core.letta, name) for name in TOOLS}
    ids = [str(t["id"]) for t in found.values() if t]
    for agent in agents:
        for tool_id in ids:
            tools_api.detach_tool(core.letta, agent, tool_id)
        env = tools_api.tool_env(core.letta, agent)
        if URL_VAR in env or TOKEN_VAR in env:
            env.pop(URL_VAR, None)
            env.pop(TOKEN_VAR, None)
            tools_api.set_tool_env(core.letta, agent, env)
    from promptyoself.store import agent_tokens as stored

    for agent in agents:  # the tools are gone: so is their credential
        stored.revoke(core.store, core.now(), agent_id=agent)
    if all_agents:
        for tool_id in ids:
            tools_api.delete_tool(core.letta, tool_id)
    return {"status": "success", "agents": agents, "removed_tools": sorted(n for n, t in found.items() if t),
            "deleted": all_agents}


async def cancel_own(core: Core, schedule_id: int, agent_id: str | None) -> CancelResult:
    """``cancel``, refused (404) when ``agent_id`` is given and the schedule is another agent's."""
    from promptyoself.errors import NotFound

    if agent_id:
        row = await core.deliveries.schedule(schedule_id)
        if row is None or row.agent_id != agent_id:
            raise NotFound(f"No schedule {schedule_id} of agent {agent_id}.")
    return await core.scheduling.cancel(schedule_id)


def _token_source(core: Core) -> str:
    """Where this process's token came from: the environment (or ``.env``), the token file, or nowhere."""
    from promptyoself.config import read_token_file, token_file

    if core.settings.http_token is None:
        return "none"
    stored = read_token_file(token_file(core.settings.db_url))
    return "file" if stored == core.settings.http_token.get_secret_value().strip() else "environment"


def service_token(core: Core) -> dict[str, object]:
    """What the running service (the holder of the worker lease, when it is ``promptyoself serve``)
    recorded of its operator token when it started: its source and a short fingerprint. ``known``
    is false when no live service holds the lease (stopped, or a detached worker delivers)."""
    import hashlib
    import json

    from promptyoself.store.lease import lease_alive, read_lease

    row = read_lease(core.store)
    try:
        info = json.loads(row.info or "{}") if row is not None else {}
    except ValueError:
        info = {}
    token = info.get("token") if isinstance(info, dict) and info.get("role") == "service" else None
    if row is None or not lease_alive(row, core.now()) or not isinstance(token, dict):
        return {"known": False}
    mine = core.settings.http_token.get_secret_value().strip() if core.settings.http_token else ""
    fingerprint = token.get("sha256")
    same = (fingerprint is None and not mine) or (
        bool(mine) and fingerprint == hashlib.sha256(mine.encode()).hexdigest()[:12])
    return {"known": True, "pid": row.pid, "source": token.get("source"), "same_as_here": same}


def show_token(core: Core) -> TokenResult:
    """The operator token for this database, where it comes from, and what the running service uses."""
    from promptyoself.config import token_file

    source = _token_source(core)
    path = str(token_file(core.settings.db_url))
    token = core.settings.http_token.get_secret_value().strip() if core.settings.http_token else None
    words = {"environment": "PROMPTYOSELF_HTTP_TOKEN (environment or .env); it wins over the token file.",
             "file": f"the token file {path}.",
             "none": "nowhere: neither PROMPTYOSELF_HTTP_TOKEN nor the token file is set here; "
                     "`promptyoself token rotate` makes one."}
    service = service_token(core)
    if not service["known"]:
        running = (" Whether the running service uses it cannot be known from here: no running `promptyoself "
                   "serve` holds the worker lease of this database (it reads its token when it starts).")
    else:
        where = {"environment": "from its environment", "file": "from the token file",
                 "none": "without a token (loopback only)"}.get(str(service["source"]), "")
        running = (f" The running service (pid {service['pid']}) runs {where}, "
                   + ("the same token as this shell." if service["same_as_here"]
                      else "NOT this shell's token: use the service's environment, or restart it."))
    return {"status": "success", "token_file": path, "source": source, "token": token, "service": service,
            "message": f"This shell's operator token comes from {words[source]}{running}"}


def rotate_token(core: Core) -> TokenResult:
    """Write a new random operator token to the token file (0600). The running service reads the token
    when it starts: restart it. Agents keep working: they hold agent tokens, not this one."""
    import os
    import secrets

    from promptyoself.config import token_file

    if _token_source(core) == "environment":
        raise InvalidArgument("PROMPTYOSELF_HTTP_TOKEN is set in the environment or .env and wins over the token "
                              "file: unset it (the file then holds the token), or change it there.")
    path = token_file(core.settings.db_url)
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    from pydantic import SecretStr

    core.settings = core.settings.model_copy(update={"http_token": SecretStr(token)})
    restart = "Restart the service (`systemctl --user restart promptyoself`, or stop and start `promptyoself serve`)"
    return {"status": "success", "token_file": str(path), "source": "file", "rotated": True,
            "message": f"Wrote a new operator token to {path}. {restart} so that it accepts the new token. "
                       "Agents hold their own agent tokens and keep working; `promptyoself token rotate "
                       "--agent-id ID` rotates one of those."}


def rotate_agent_tokens(core: Core, agent_ids: list[str], service_url: str | None) -> dict[str, object]:
    """A new agent token for each agent, its earlier ones revoked at once. With ``service_url`` the
    agents' native tools on Letta get the new token (``install``); else the tokens are printed once."""
    from promptyoself.core import agent_tokens

    if service_url:
        installed = install(core, agent_ids=agent_ids, all_agents=False, service_url=service_url, check=False)
        return {"status": "success", "rotated": True, "agents": installed["agents"],
                "message": f"Rotated the agent token of {len(installed['agents'])} agent(s) and gave it to their "
                           "native tools on Letta; the earlier tokens are refused from now on."}
    minted = [asyncio.run(agent_tokens.mint(core, agent, rotate=True)) for agent in dict.fromkeys(agent_ids)]
    return {"status": "success", "rotated": True, "tokens": [
        {"agent_id": m["agent_id"], "id": m["id"], "token": m["token"]} for m in minted],
        "message": f"Rotated the agent token of {len(minted)} agent(s); the earlier tokens are refused from now "
                   "on. Each new token is shown once: give it to its agent (PROMPTYOSELF_AGENT_TOKEN, or "
                   "--service-url to hand it to the agent's native tools on Letta)."}
