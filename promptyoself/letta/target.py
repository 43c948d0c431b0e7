"""The one small interface delivery talks to, whatever Letta a schedule goes to (DESIGN §12): send a
message carrying the occurrence's otid, find an otid, probe for health.

``RestTarget`` is the Letta REST API (``LettaClient``: 0.16.x self-hosted, or Letta Cloud);
``promptyoself.letta.code.LettaCodeClient`` is the Letta Code App Server over its WebSocket. Both map
failures onto the same error tree, so delivery retries, pauses and looks up the same way for both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from promptyoself.letta.client import LettaClient

REST = "letta"
LETTA_CODE = "letta-code"
TARGETS = (REST, LETTA_CODE)
LOCAL_AGENT_PREFIX = "agent-local-"


def is_local_agent(agent_id: str) -> bool:
    """An agent of a Letta Code App Server's local backend (``agent-local-<uuid>``). Here, not in
    ``letta.code``: choosing a schedule's target must not import httpx and websockets (~0.1-0.3 s of
    a CLI call, httpx's own command line pulling in rich and pygments)."""
    return agent_id.startswith(LOCAL_AGENT_PREFIX)


class DeliveryTarget(Protocol):
    name: str

    def send(
        self,
        agent_id: str,
        text: str,
        *,
        otid: str,
        conversation_id: str | None = None,
        payload: dict[str, Any] | None = None,
        guard: Callable[[], bool] | None = None,
        attempt: int = 1,
    ) -> dict[str, Any]:
        """Send one user message; ``{"run_id", "route"}``. ``LettaUnavailable`` with
        ``details["in_doubt"]`` when it may have arrived; ``NotSent`` when ``guard`` said no."""
        ...

    def find(self, agent_id: str, otid: str, conversation_id: str | None = None) -> str:
        """``"found"``, ``"absent"`` or ``"pending"`` (not seen yet, but it may still arrive)."""
        ...

    def find_run(self, agent_id: str, otid: str, conversation_id: str | None = None) -> tuple[str, str | None]:
        """``find``'s answer and, when found, the run that carried the message (for history)."""
        ...

    def probe(self) -> dict[str, Any]:
        """A cheap health check; raises ``LettaUnavailable`` / ``LettaAuth``."""
        ...


class RestTarget:
    """The Letta REST API behind ``DeliveryTarget`` (conversations do not exist there)."""

    name = REST

    def __init__(self, client: LettaClient) -> None:
        self.client = client

    def send(
        self,
        agent_id: str,
        text: str,
        *,
        otid: str,
        conversation_id: str | None = None,
        payload: dict[str, Any] | None = None,
        guard: Callable[[], bool] | None = None,
        attempt: int = 1,
    ) -> dict[str, Any]:
        return self.client.send_message(agent_id, text, otid=otid, payload=payload, guard=guard)

    def find(self, agent_id: str, otid: str, conversation_id: str | None = None) -> str:
        return self.client.find_message(agent_id, otid)

    def find_run(self, agent_id: str, otid: str, conversation_id: str | None = None) -> tuple[str, str | None]:
        return self.client.find_message_run(agent_id, otid)

    def probe(self) -> dict[str, Any]:
        self.client.list_agents(limit=1)
        return {"status": "ok"}
