"""Letta's tool and agent-environment routes used by the native tools (``core/native_tools.py``).

Functions over a ``LettaClient`` (its ``_request`` keeps auth, errors and the user agent in one place).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from promptyoself.letta.client import LettaClient


def _seg(value: str) -> str:
    from promptyoself.letta.client import _seg as seg

    return seg(value)


def upsert_tool(client: LettaClient, source_code: str, *, tags: list[str]) -> dict[str, Any]:
    """``PUT /v1/tools/``: create or update the tool named after the source's function."""
    return dict(client._request("PUT", "/v1/tools/", json={"source_code": source_code, "tags": tags}).json())


def find_tool(client: LettaClient, name: str) -> dict[str, Any] | None:
    """The tool named ``name`` (``GET /v1/tools/?name=``), or ``None``."""
    found = client._request("GET", "/v1/tools/", params={"name": name}).json()
    for tool in found if isinstance(found, list) else []:
        if isinstance(tool, dict) and tool.get("name") == name:
            return tool
    return None


def delete_tool(client: LettaClient, tool_id: str) -> None:
    client._request("DELETE", f"/v1/tools/{_seg(tool_id)}")


def attach_tool(client: LettaClient, agent_id: str, tool_id: str) -> None:
    client._request("PATCH", f"/v1/agents/{_seg(agent_id)}/tools/attach/{_seg(tool_id)}", agent_id=agent_id)


def detach_tool(client: LettaClient, agent_id: str, tool_id: str) -> None:
    client._request("PATCH", f"/v1/agents/{_seg(agent_id)}/tools/detach/{_seg(tool_id)}", agent_id=agent_id)


def tool_env(client: LettaClient, agent_id: str) -> dict[str, str]:
    """The agent's ``tool_exec_environment_variables`` as a dict."""
    agent = client._request("GET", f"/v1/agents/{_seg(agent_id)}", agent_id=agent_id).json()
    out: dict[str, str] = {}
    for item in agent.get("tool_exec_environment_variables") or []:
        if isinstance(item, dict) and isinstance(item.get("key"), str):
            out[item["key"]] = str(item.get("value") or "")
    return out


def set_tool_env(client: LettaClient, agent_id: str, env: dict[str, str]) -> None:
    """Replace the agent's ``tool_exec_environment_variables`` (``PATCH /v1/agents/{id}``)."""
    client._request("PATCH", f"/v1/agents/{_seg(agent_id)}", agent_id=agent_id,
                    json={"tool_exec_environment_variables": env})
