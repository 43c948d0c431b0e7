"""The one async interface the delivery engine talks to, whatever receives a prompt.

Contract (every target keeps it; the engine relies on nothing else):

- ``send(occ, fence)`` delivers one occurrence. ``fence()`` is the claim's fence: the target calls it
  right before the request's first byte is written (socket ready, nothing sent yet; for a subprocess,
  right before it is started) and raises ``NotSent`` when it answers False. The occurrence's id
  (``occ.occurrence_id``, deterministic, stable across retries) travels with the message so that
  ``lookup`` can find it.
- Failures map onto the error tree in ``promptyoself.errors``:
  ``TargetUnavailable`` (transient: connect error, timeout, 5xx, 429; ``details["in_doubt"]`` when the
  request may have arrived, ``details["retry_after"]`` in seconds when the receiver asked for it),
  ``TargetAuth`` (401/403: back off, shown in health), ``AgentNotFound`` / ``TargetGone`` (permanent:
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


# ---- the plug-in: what a target package gives the rest of PromptYoSelf (DESIGN §14, issue 41) ----------


@dataclass(frozen=True)
class Call:
    """What a target may read of one scheduling call to find where its prompts go.

    ``options`` are the call's ``target_options`` already validated by the plug-in's ``options`` model
    (its defaults filled in). ``agent()`` is the core's agent inference (the explicit ``agent_id``, the
    MCP request's metadata, the session's and process's defaults, the environment): a plug-in whose
    destinations are agents asks it; one whose destinations are found otherwise (a Claude Code session
    from the process tree) does not. ``operator`` is True when the caller holds the operator's
    credential (or is a local process with the database), False for an agent's token (the request's,
    or the process's ``PROMPTYOSELF_AGENT_TOKEN``): a plug-in must not let an agent's token reach a
    destination that belongs to someone else. With ``operator`` False, ``agent_id`` is the token's own
    agent (every face makes it so, and refuses another agent named)."""

    agent_id: str | None
    """The ``agent_id`` the caller gave (None when it gave none)."""
    options: Any
    """An instance of the plug-in's ``options`` model."""
    settings: Any
    """``promptyoself.config.Settings``."""
    agent: Callable[[], str]
    environ: Mapping[str, str] | None = None
    """The caller's environment (None: this process's; empty: a remote caller's, not known, so no
    session is found from it): where a session is found from."""
    operator: bool = True


@dataclass(frozen=True)
class Destination:
    """Where one new schedule goes: stored with it (``agent_id``, ``target``, ``target_options``)."""

    agent_id: str
    options: Mapping[str, Any] = field(default_factory=dict)
    """Stored as the schedule's ``target_options`` (JSON) and handed to ``send`` as ``Occurrence.options``."""
    conversation_id: str | None = None
    validate: bool = False
    """Ask the plug-in's ``validate`` whether the agent exists before storing (unless skip_validation)."""


@dataclass(frozen=True)
class Watch:
    """How health watches a target: the reason code and its fix when the probe fails, and whether
    this deployment has it configured (a configured target is probed even with no schedule)."""

    reason: str
    fix: str
    configured: bool = False


@runtime_checkable
class TargetPlugin(Protocol):
    """One target, as its package declares it in the entry point group ``promptyoself.targets``
    (``name = "package.module:attribute"``, the attribute being an object with these members).

    Importing the module that holds it must be cheap: heavy clients are imported in ``create``.

    Optional: ``cli(parser)``, given the ``argparse`` parser of ``promptyoself <name>``, adds that
    command's arguments (installers: ``promptyoself claude-code install ...``) and returns the function
    ``run(core, args) -> dict`` that carries it out (the dict is printed as the command's result).
    """

    name: str
    summary: str
    """One line: what it delivers to (``promptyoself targets``, the tools' descriptions)."""
    options: type[Any]
    """A pydantic model of the per-schedule ``target_options`` (``extra="forbid"``)."""
    aliases: tuple[str, ...]
    """Names of ``options`` fields that callers may also pass as top-level schedule options (the
    documented names from before ``target_options``: ``session_id``, ``cwd``, ``endpoint``, ...)."""

    def claims(self, call: Call) -> bool:
        """Whether a call that names no target goes here (a call from inside a Claude Code session, an
        ``agent-local-...`` agent). The default target (Letta) claims nothing: it is the fallback."""
        ...

    def destination(self, call: Call) -> Destination:
        """The destination of ``call``, or ``InvalidArgument`` (naming the option) saying what to pass."""
        ...

    def validate(self, core: Any, agent_id: str) -> None:
        """Check that the agent exists where the prompts go (``AgentNotFound``; ``TargetUnavailable``
        when it cannot be asked). Blocking; called only for destinations with ``validate=True`` and
        unless the caller said ``skip_validation``. ``core`` gives ``settings`` and ``letta`` (the
        core's Letta REST client)."""
        ...

    def create(self, settings: Any) -> DeliveryTarget:
        """A new ``DeliveryTarget`` configured from ``settings`` (``promptyoself.config.Settings``)."""
        ...

    def watch(self, settings: Any) -> Watch:
        """How health reports this target."""
        ...
