"""The Letta Code App Server as a delivery target (``target = "letta-code"``), through
``promptyoself.targets.letta_code.client.LettaCodeClient`` (one WebSocket per call; a send holds its socket until the
message's turn has finished).

The occurrence's id travels as ``client_message_id`` (``otid~N`` on a re-send, N the attempt: see
``letta.code``); ``lookup`` reads the conversation's queue and loop, then its messages. The fence is
asked with the socket open, right before the input frame is written. No ``LETTA_CODE_URL``: every call
raises ``TargetUnavailable`` (transient: a schedule waiting for it is retried, never dropped).
"""

from __future__ import annotations

from promptyoself.config import Settings
from promptyoself.errors import TargetUnavailable
from promptyoself.targets.base import Fence, Found, Occurrence, PreviousTurn, Sent
from promptyoself.targets.letta_code import receipt as letta_code_receipt
from promptyoself.targets.letta_code.blocking import BlockingCalls
from promptyoself.targets.letta_code.client import LettaCodeClient
from promptyoself.targets.letta_code.settings import LettaCodeSettings, read

NOT_CONFIGURED = "No Letta Code App Server is configured: set LETTA_CODE_URL (e.g. ws://127.0.0.1:4500)."


class LettaCodeTarget:
    name = "letta-code"

    def __init__(self, settings: Settings, *, client: LettaCodeClient | None = None,
                 config: LettaCodeSettings | None = None) -> None:
        own = config or read()  # this target's own settings (settings.py): LETTA_CODE_URL and its turn timeout
        url = own.letta_code_url
        self.client = client or (LettaCodeClient(url, timeout=settings.letta_timeout,
                                                 turn_timeout=own.letta_code_turn_timeout) if url else None)
        self._calls = BlockingCalls(settings.max_in_flight + 2, "promptyoself-letta-code")

    def _client(self) -> LettaCodeClient:
        if self.client is None:
            raise TargetUnavailable(NOT_CONFIGURED)
        return self.client

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        client = self._client()
        sent = await self._calls.run(client.send, occ.agent_id, occ.text, otid=occ.occurrence_id,
                                     conversation_id=occ.conversation_id, guard=fence, attempt=occ.attempt)
        details: dict[str, object] = {k: sent[k] for k in ("client_message_id", "disposition") if k in sent}
        return Sent(route=str(sent.get("route") or "ws"), run_id=sent.get("run_id"), details=details,
                    receipt=letta_code_receipt.of_deltas(sent.get("turn") or []))

    async def running(self, occ: Occurrence, previous: PreviousTurn | None) -> bool:
        """The overlap policy's busy check (issue 43): the conversation has a turn running, or inputs
        waiting in a live queue (``sync``); a queue paused after a restart is not a turn."""
        client = self._client()
        st = await self._calls.run(client.state, occ.agent_id, occ.conversation_id)
        return st.running or (bool(st.queue) and not st.paused)

    async def lookup(self, occ: Occurrence) -> Found:
        client = self._client()
        state, run_id = await self._calls.run(client.find_run, occ.agent_id, occ.occurrence_id, occ.conversation_id)
        return Found.of(state, run_id)

    async def probe(self) -> None:
        await self._calls.run(self._client().probe)

    def readiness(self) -> str:
        if self.client is None:
            return "Letta Code App Server: LETTA_CODE_URL not set"
        return f"Letta Code App Server at {self.client.shown_url}"

    async def aclose(self) -> None:
        if self.client is not None:
            self.client.close()
        self._calls.close()
