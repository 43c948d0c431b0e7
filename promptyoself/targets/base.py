"""The one async interface the delivery engine talks to, whatever receives a prompt.

Contract (every target keeps it; the engine relies on nothing else):

- ``send(occ, fence)`` delivers one occurrence. ``fence()`` is the claim's fence: the target calls it
  right before the request's first byte is written (socket ready, nothing sent yet; for a subprocess,
  right before it is started) and raises ``NotSent`` when it answers False. The occurrence's id
  (``occ.occurrence_id``, deterministic, stable across retries) travels with the message so that
  ``lookup`` can find it.
- Failures map onto the error tree in ``promptyoself.errors``:
  ``LettaUnavailable`` (transient: connect error, timeout, 5xx, 429; ``details["in_doubt"]`` when the
  request may have arrived, ``details["retry_after"]`` in seconds when the receiver asked for it),
  ``LettaAuth`` (401/403: back off, shown in health), ``AgentNotFound`` / ``TargetGone`` (permanent:
  the schedule is paused with the reason), ``TargetRejected`` (this occurrence fails, the schedule
  moves on), ``NotSent`` (the fence said no: nothing was written, the claim is given back).
- ``lookup(occ)`` answers whether an occurrence whose earlier attempt may have arrived is there:
  ``found`` (record it delivered, do not send), ``absent`` (send), ``pending`` (not seen yet but may
  still arrive: look again later). A target that cannot look answers ``absent`` only when a re-send is
  safe for its receiver (webhooks: the receiver dedups on ``webhook-id``).
- ``probe()`` is a cheap readiness check that raises like ``send``; ``readiness()`` is one line for
  health ("claude 2.1.197 at /usr/bin/claude", "endpoint ops: https://... reachable").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

Fence = Callable[[], bool]
"""The claim's fence: True while the claim is still held and a write may start. Cheap and
non-blocking (it reads the claim keeper's state); asked right before the first byte is written."""

LookupState = Literal["found", "absent", "pending"]


@dataclass(frozen=True)
class Occurrence:
    """One due occurrence of a schedule, as a target sees it."""

    schedule_id: int
    occurrence_id: str
    """Deterministic per (schedule, slot): Letta's ``otid``, Letta Code's ``client_message_id``, the
    webhook's ``webhook-id``, the marker in a Claude Code transcript."""
    agent_id: str
    text: str
    """What the agent reads: the envelope (header line + prompt) in annotated format, else the prompt."""
    prompt: str
    """The prompt alone (a webhook carries both)."""
    due: datetime
    attempt: int = 1
    conversation_id: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    """Target-specific, stored with the schedule (e.g. Claude Code ``session_id`` and ``cwd``, a
    webhook ``endpoint`` name, Letta's ``payload``)."""


@dataclass(frozen=True)
class Sent:
    """A send that the receiver accepted."""

    route: str
    """How it went (``async``, ``sync``, ``ws``, ``resume``, ``channel``, ``webhook``): history shows it."""
    run_id: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Found:
    state: LookupState
    run_id: str | None = None

    @classmethod
    def of(cls, state: str, run_id: str | None = None) -> Found:
        """From a client's answer (``"found"`` | ``"absent"`` | ``"pending"``); anything else is a bug."""
        if state not in ("found", "absent", "pending"):
            raise ValueError(f"a look-up answers found, absent or pending, not {state!r}")
        return cls(state, run_id)  # type: ignore[arg-type]


@runtime_checkable
class DeliveryTarget(Protocol):
    """A receiver of prompts. Implementations are async; blocking work goes through ``asyncio.to_thread``."""

    name: str

    async def send(self, occ: Occurrence, fence: Fence) -> Sent: ...

    async def lookup(self, occ: Occurrence) -> Found: ...

    async def probe(self) -> None: ...

    def readiness(self) -> str: ...

    async def aclose(self) -> None: ...
