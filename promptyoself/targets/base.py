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
- Overlap (issue 43): a target that can tell whether a schedule's previous turn still runs has
  ``running(occ, previous)`` (``BusyCheck``); the engine asks it before sending an occurrence of a
  schedule whose overlap policy is ``skip`` or ``queue`` (``delivery.overlap``).
- Receipts (issue 43): ``Sent.receipt`` is what the target knows of the turn the prompt started (a
  ``Receipt``: reply excerpt, tools, steps, tokens, cost, permission denials, an HTTP status and body
  excerpt), bounded by ``Receipt.bounded``. None means the target gives none (history says so). A
  receipt that needs a later look is returned ``state="pending"`` (with ``ref``: what to look at);
  the engine then calls the target's optional ``receipt(pending)`` (``ReceiptSource``) from a task of
  its own, never a sender, until it answers a receipt that is not pending, or the receipt times out
  (``timed_out``). The occurrence stays delivered either way.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields, replace
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


ReceiptState = Literal["complete", "pending", "none", "timed_out"]

EXCERPT_BYTES = 2048
"""A receipt's reply and body excerpts: at most this many bytes of UTF-8."""
MAX_TOOLS = 20
"""Tool names kept in a receipt (``tool_calls`` still counts them all)."""
NOTE_CHARS = 300
REF_ENTRIES = 8
"""A pending receipt's ``ref``: the target's first 8 entries, and one more that the engine adds (the
process that follows it up), so that a target's eighth entry never pushes the engine's out."""


def excerpt(text: object, limit: int = EXCERPT_BYTES) -> str | None:
    """``text`` cut to ``limit`` bytes of UTF-8 (never mid-character); None for nothing."""
    if text is None:
        return None
    raw = str(text).encode("utf-8", errors="replace")
    if len(raw) <= limit:
        return raw.decode("utf-8", errors="replace")
    return raw[:limit].decode("utf-8", errors="ignore")


MAX_SPEND_TOKENS = 10**12
"""The most tokens one turn's receipt counts against a cost budget (a bound on what a target says)."""
MAX_SPEND_USD = 1e9
"""The most USD one turn's receipt counts against a cost budget."""


def _count(value: object) -> int | None:
    """A non-negative int, or None (what a target did not report)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return max(0, int(value))


@dataclass(frozen=True)
class Receipt:
    """What a delivered turn did, as its target reports it; every field bounded (``bounded``), a field
    the target does not report is None. Stored as JSON with the ``delivered`` history row."""

    state: ReceiptState = "complete"
    """``complete``: what the target reported; ``pending``: to be read later (``ref``); ``none``: the
    target gives none (``note`` says why); ``timed_out``: it never came."""
    reply: str | None = None
    """An excerpt of the agent's answer (at most ``EXCERPT_BYTES`` bytes)."""
    tools: tuple[str, ...] = ()
    """Names of the tools it called, in order, at most ``MAX_TOOLS``."""
    tool_calls: int | None = None
    """How many tool calls (all of them, also past ``MAX_TOOLS``)."""
    steps: int | None = None
    """Model steps (Letta) or turns (Claude Code's ``num_turns``)."""
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    """Input tokens served from (or read from) a cache."""
    reasoning_tokens: int | None = None
    cost_usd: float | None = None
    permission_denials: int | None = None
    stop_reason: str | None = None
    http_status: int | None = None
    """A webhook's answer: its status code ..."""
    body: str | None = None
    """... and an excerpt of its body (at most ``EXCERPT_BYTES`` bytes)."""
    note: str | None = None
    """Why there is none, what it waits for, why it timed out."""
    ref: Mapping[str, Any] = field(default_factory=dict)
    """For a pending receipt: what the target's ``receipt`` needs to look again (small, not shown: at
    most ``REF_ENTRIES`` entries of the target's)."""

    def bounded(self) -> Receipt:
        """The same receipt with every field within its bound (made once per receipt: a delivery asks
        for it three times, for its spend, its stored form and its state)."""
        if self.__dict__.get("_within"):  # outside the fields: equality, repr and the JSON ignore them
            return self
        done: Receipt = self.__dict__.get("_bounded") or self._bound()
        done.__dict__["_within"] = True
        self.__dict__["_bounded"] = done
        return done

    def _bound(self) -> Receipt:
        tools = tuple(str(t)[:64] for t in self.tools[:MAX_TOOLS])
        calls = _count(self.tool_calls)
        cost = self.cost_usd if isinstance(self.cost_usd, int | float) and not isinstance(self.cost_usd, bool) \
            else None
        ref = {str(k)[:40]: v for k, v in list(self.ref.items())[:REF_ENTRIES + 1]
               if isinstance(v, str | int | float | bool) or v is None}
        return replace(
            self, reply=excerpt(self.reply), body=excerpt(self.body), tools=tools,
            tool_calls=max(calls, len(self.tools)) if calls is not None else (len(self.tools) or None),
            steps=_count(self.steps), input_tokens=_count(self.input_tokens), output_tokens=_count(self.output_tokens),
            cached_tokens=_count(self.cached_tokens), reasoning_tokens=_count(self.reasoning_tokens),
            cost_usd=None if cost is None or cost != cost else round(max(0.0, float(cost)), 6),
            permission_denials=_count(self.permission_denials), http_status=_count(self.http_status),
            stop_reason=excerpt(self.stop_reason, 64), note=excerpt(self.note, NOTE_CHARS),
            ref={k: excerpt(v, 512) if isinstance(v, str) else v for k, v in ref.items()})

    @property
    def total_tokens(self) -> int | None:
        """The turn's tokens as a cost budget counts them: input (cached included) plus output (None
        when the target reports neither)."""
        if self.input_tokens is None and self.output_tokens is None:
            return None
        return (self.input_tokens or 0) + (self.output_tokens or 0)

    def spend(self) -> tuple[int | None, float | None]:
        """What this receipt costs the agent's day (``tokens``, ``cost_usd``), bounded: the counts of a
        ``complete`` receipt, (None, None) for any other (pending, none, timed out)."""
        if self.state != "complete":
            return None, None
        bounded = self.bounded()
        tokens, cost = bounded.total_tokens, bounded.cost_usd
        return (None if tokens is None else min(tokens, MAX_SPEND_TOKENS),
                None if cost is None else min(cost, MAX_SPEND_USD))

    def to_json(self) -> str:
        """The stored form (bounded first): JSON, the fields a target did not report left out. Read
        field by field: ``dataclasses.asdict`` deep-copies every value, and this runs once per delivery
        (it was a tenth of a worker's CPU per delivery in the burst)."""
        bounded = self.bounded()
        data: dict[str, Any] = {name: getattr(bounded, name) for name in _RECEIPT_FIELDS}
        data["tools"], data["ref"] = list(bounded.tools), dict(bounded.ref)
        return json.dumps({k: v for k, v in data.items() if v not in (None, [], {})}, ensure_ascii=False,
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | None) -> Receipt | None:
        """A stored receipt (None when there is none or it is unreadable)."""
        if not raw:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("state") not in ("complete", "pending", "none", "timed_out"):
            return None
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in data.items() if k in known}
        try:
            values["tools"] = tuple(values.get("tools") or ())
            return cls(**values).bounded()
        except (TypeError, AttributeError, ValueError):  # a row that is not one of ours
            return None

    def redacted(self, redact: Callable[[str | None], str | None]) -> Receipt:
        """The texts (reply, body, note) passed through ``redact``: history holds no secret (this same
        receipt when there was nothing to take out)."""
        reply, body, note = redact(self.reply), redact(self.body), redact(self.note)
        if reply == self.reply and body == self.body and note == self.note:
            return self
        return replace(self, reply=reply, body=body, note=note)

    @classmethod
    def none(cls, note: str) -> Receipt:
        return cls(state="none", note=note)


_RECEIPT_FIELDS = tuple(f.name for f in fields(Receipt))


@dataclass(frozen=True)
class Sent:
    """A send that the receiver accepted."""

    route: str
    """How it went (``async``, ``sync``, ``ws``, ``resume``, ``channel``, ``webhook``): history shows it."""
    run_id: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    receipt: Receipt | None = None
    """What the target knows of the turn (see the module's contract); None: it gives no receipt."""


@dataclass(frozen=True)
class PendingReceipt:
    """A delivered occurrence whose receipt is still to come, as the engine hands it to the target's
    ``receipt``: the history row's id, the agent, the run it started (when the target named one), and
    the pending receipt (its ``ref``)."""

    delivery_id: int
    agent_id: str
    run_id: str | None
    receipt: Receipt
    attempted_at: datetime


Overlap = Literal["skip", "queue", "allow"]
"""A schedule's overlap policy (issue 43 point 3): what happens to an occurrence due while the
schedule's previous turn is still running (``delivery.overlap``)."""
OVERLAP_POLICIES: tuple[str, ...] = ("skip", "queue", "allow")


@dataclass(frozen=True)
class PreviousTurn:
    """The schedule's last delivered occurrence, as the engine hands it to ``running``: the run it
    started (when the target named one), when it was sent, and its receipt as recorded (None: none
    recorded, or a row from before receipts)."""

    run_id: str | None
    attempted_at: datetime
    receipt: Receipt | None = None


@runtime_checkable
class BusyCheck(Protocol):
    """A target that can tell whether a schedule's previous turn is still running (optional:
    ``running`` on its ``DeliveryTarget``; the plug-in says so with ``busy_check``). Asked right before
    a send of a schedule whose overlap policy is ``skip`` or ``queue``, with the occurrence about to be
    sent and the schedule's previous delivered turn (None: it has none). True: that turn (or, for a
    target whose destination takes one turn at a time, any turn there) still runs. Raises like ``send``
    when it cannot ask (the occurrence is then retried as after a failed send). A target without it
    cannot tell: its schedules are sent whatever their policy (as ``allow``), and say so."""

    async def running(self, occ: Occurrence, previous: PreviousTurn | None) -> bool: ...


@runtime_checkable
class ReceiptSource(Protocol):
    """A target that can read a receipt later (optional: ``receipt`` on its ``DeliveryTarget``). Answers
    the receipt now known, or the same pending one when the turn has not finished yet; raises like
    ``send`` when it cannot ask (the engine asks again later)."""

    async def receipt(self, pending: PendingReceipt) -> Receipt: ...


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

    Optional (issue 43 point 3, overlap): ``default_overlap`` (``skip`` | ``queue`` | ``allow``; absent:
    ``allow``), the policy a new schedule of this target gets when its caller names none; and
    ``busy_check``, one line saying what "still running" means for this target (e.g. "the Letta run
    the previous delivery started has not finished"), given when its ``DeliveryTarget`` has ``running``
    (``BusyCheck``); absent or None: the target cannot tell, and its schedules behave as ``allow``.

    Optional (issue 41 point 3, a target owns its settings): ``config()`` returns the target's own
    settings (a ``promptyoself.config.PluginSettings`` read by ``read_plugin_settings`` from the
    environment and the ``.env`` file, cached), raising ``ConfigError`` naming the variable when one is
    malformed: the registry then refuses this target with that line (health and ``promptyoself
    targets`` show it) and every other target works as before. ``secrets()`` returns the secrets those
    settings hold (``list[str]``), hidden by the log filter and the history's redaction from the start
    of the process. ``shown(settings)`` returns fields this target adds to health's answer.
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

    def validate(self, core: Any, agent_id: str) -> Awaitable[None] | None:
        """Check that the agent exists where the prompts go (``AgentNotFound``; ``TargetUnavailable``
        when it cannot be asked), called only for destinations with ``validate=True`` and unless the
        caller said ``skip_validation``: an ``async def`` is awaited on the core's event loop (the
        built-in targets'), a plain ``def`` may block and runs in a thread (``registry.validate``).
        ``core`` gives ``settings`` and ``letta`` (the core's blocking Letta REST client)."""
        ...

    def create(self, settings: Any) -> DeliveryTarget:
        """A new ``DeliveryTarget`` configured from ``settings`` (``promptyoself.config.Settings``)."""
        ...

    def watch(self, settings: Any) -> Watch:
        """How health reports this target."""
        ...
