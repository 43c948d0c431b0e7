"""The Letta REST API as a delivery target (``target = "letta"``): self-hosted Letta 0.16.x or Letta
Cloud, through ``promptyoself.letta.client.AsyncLettaClient`` on the engine's event loop (no thread
per send: issue 30 point 4).

The occurrence's id travels as the message's ``otid``; ``lookup`` reads the agent's runs, then its
newest messages (``find_message_run``). The fence is asked by the client when its connection is ready,
in the same step as the write of the request's head and body (aiohttp's ``on_request_chunk_sent``
trace: ``letta.client._chunk_trace``). A schedule made through Letta's scheduling API carries its stored
body in ``options["payload"]``, sent as is with the otid on its first message.
"""

from __future__ import annotations

from typing import Any

from promptyoself.config import Settings
from promptyoself.letta.client import AsyncLettaClient
from promptyoself.targets.base import Fence, Found, Occurrence, PendingReceipt, PreviousTurn, Receipt, Sent
from promptyoself.targets.letta import receipt as letta_receipt


class LettaRestTarget:
    name = "letta"

    def __init__(self, settings: Settings, *, client: AsyncLettaClient | None = None) -> None:
        # A kept connection for each send in flight (the target's own slots when
        # PROMPTYOSELF_TARGET_IN_FLIGHT names it), plus a look-up and a probe.
        slots = max(settings.max_in_flight, settings.target_in_flight.get(self.name, 0))
        self.client = client or AsyncLettaClient(settings.letta_base_url, settings.letta_token,
                                                 timeout=settings.letta_timeout, connections=slots + 2)

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        payload: Any = occ.options.get("payload")
        sent = await self.client.send_message(occ.agent_id, occ.text, otid=occ.occurrence_id,
                                              payload=payload if isinstance(payload, dict) else None, guard=fence)
        route = str(sent.get("route") or "async")
        receipt = letta_receipt.of_sync_answer(sent.get("answer")) if route == "sync" else \
            letta_receipt.pending(sent.get("run_id"))
        return Sent(route=route, run_id=sent.get("run_id"), receipt=receipt)

    async def receipt(self, pending: PendingReceipt) -> Receipt:
        """An async send's receipt: the run's turn once it has finished (``GET /v1/runs/{id}``...)."""
        if not pending.run_id:
            return Receipt.none("no Letta run to read the turn from")
        return letta_receipt.of_run(pending.receipt, await self.client.run_turn(pending.run_id))

    async def running(self, occ: Occurrence, previous: PreviousTurn | None) -> bool:
        """The overlap policy's busy check (issue 43): the run the schedule's previous delivery started
        has not finished (``GET /v1/runs/{id}``). A turn whose receipt is complete has finished (the
        sync route's, or an async run read after it ended); one that named no run cannot be asked."""
        if previous is None or not previous.run_id:
            return False
        if previous.receipt is not None and previous.receipt.state == "complete":
            return False
        return await self.client.run_running(previous.run_id)

    async def lookup(self, occ: Occurrence) -> Found:
        state, run_id = await self.client.find_message_run(occ.agent_id, occ.occurrence_id)
        return Found.of(state, run_id)

    async def probe(self) -> None:
        """One page of one agent: the server answers and takes our credentials."""
        await self.client.list_agents(limit=1)

    def readiness(self) -> str:
        return f"Letta REST API at {self.client.shown_url}"

    async def aclose(self) -> None:
        await self.client.aclose()
