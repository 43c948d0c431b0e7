"""Native Letta tools: small Python tools uploaded to Letta that call PromptYoSelf's REST API.

Letta runs them in its tool sandbox with ``LETTA_AGENT_ID`` set to the calling agent, plus the
agent's ``tool_exec_environment_variables``: ``install`` sets ``PROMPTYOSELF_SERVICE_URL`` and (when
``PROMPTYOSELF_HTTP_TOKEN`` is set) ``PROMPTYOSELF_SERVICE_TOKEN`` there, so the token never appears in
tool source. Works with a stock Letta (no stdio MCP, no HTTP MCP address rules).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from promptyoself.core.results import CancelResult, NativeToolsInstalled, NativeToolsRemoved
from promptyoself.errors import InvalidArgument

if TYPE_CHECKING:
    from promptyoself.core.operations import Core

TAG = "promptyoself"
URL_VAR = "PROMPTYOSELF_SERVICE_URL"
TOKEN_VAR = "PROMPTYOSELF_SERVICE_TOKEN"

# Each tool is one self-contained function (Letta uploads a single function's source).
_CALL = '''    import json
    import os
    import urllib.error
    import urllib.request

    base = os.environ["PROMPTYOSELF_SERVICE_URL"].rstrip("/")
    headers = {"Content-Type": "application/json"}
    if os.environ.get("PROMPTYOSELF_SERVICE_TOKEN"):
        headers["Authorization"] = "Bearer " + os.environ["PROMPTYOSELF_SERVICE_TOKEN"]
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.read().decode() or str(exc)
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
        str: JSON with the schedule id and its {run} run, or an error message.
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
        str: JSON saying whether it was cancelled, or an error message.
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


def install(
    core: Core, *, agent_ids: list[str] | None, all_agents: bool, service_url: str
) -> NativeToolsInstalled:
    """Upsert the tools, attach them to the agents and set the agents' tool environment."""
    from promptyoself.letta import tools_api

    if not service_url.startswith(("http://", "https://")):
        raise InvalidArgument("--service-url must be the http(s) URL Letta's tool sandbox reaches PromptYoSelf at.")
    agents = _agents(core, agent_ids, all_agents)
    tools = {name: tools_api.upsert_tool(core.letta, src, tags=[TAG]) for name, src in tool_sources().items()}
    token = core.settings.http_token.get_secret_value().strip() if core.settings.http_token else ""
    for agent in agents:
        env = tools_api.tool_env(core.letta, agent)
        env[URL_VAR] = service_url.rstrip("/")
        if token:
            env[TOKEN_VAR] = token
        else:
            env.pop(TOKEN_VAR, None)
        tools_api.set_tool_env(core.letta, agent, env)
        for tool in tools.values():
            tools_api.attach_tool(core.letta, agent, str(tool["id"]))
    return {
        "status": "success",
        "tools": {name: t.get("id") for name, t in tools.items()},
        "agents": agents,
        "service_url": service_url.rstrip("/"),
        "message": f"Installed {len(tools)} tools on {len(agents)} agent(s).",
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
    if all_agents:
        for tool_id in ids:
            tools_api.delete_tool(core.letta, tool_id)
    return {"status": "success", "agents": agents, "removed_tools": sorted(n for n, t in found.items() if t),
            "deleted": all_agents}


def cancel_own(core: Core, schedule_id: int, agent_id: str | None) -> CancelResult:
    """``cancel``, refused (404) when ``agent_id`` is given and the schedule is another agent's."""
    from promptyoself.errors import NotFound
    from promptyoself.store import schedules

    if agent_id:
        row = schedules.get(core.store, schedule_id)
        if row is None or row.agent_id != agent_id:
            raise NotFound(f"No schedule {schedule_id} of agent {agent_id}.")
    return core.cancel(schedule_id)
