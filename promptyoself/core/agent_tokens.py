"""Agent tokens: a credential bound to one agent (issue 29 item 10).

Two kinds of bearer token reach the service:

* the **operator token** (``PROMPTYOSELF_HTTP_TOKEN`` or its token file): the console, approvals,
  policy, every agent's schedules;
* an **agent token** (``pys_agent_...``), minted per agent by ``promptyoself letta install-tools``,
  a target's installer or ``promptyoself token mint``: that agent's own schedules only
  (create, list, history, pause, resume, cancel). Naming another agent or asking for an operator-only
  action is ``Forbidden`` (HTTP 403); another agent's schedule id is ``NotFound`` (404, so ids of
  other agents are not revealed).

Only the SHA-256 of a token is stored. A slow password hash (bcrypt, argon2) protects guessable
secrets; a token here is 32 random bytes (256 bits), which no one can guess or brute-force from its
hash, so a fast hash is as safe and lets every request be matched through the unique index on the
hash in one look-up, without a per-request key-derivation cost.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from promptyoself.core.agents import normalize_agent_id
from promptyoself.errors import Forbidden, InvalidArgument, NotFound

if TYPE_CHECKING:  # the store loads on first use: an MCP server's start-up imports no SQLAlchemy
    from promptyoself.store.delivery_store import DeliveryStore


class Core(Protocol):
    """What these functions need of ``promptyoself.core.operations.Core`` (named here without
    importing it: target installers mint tokens): the store's async verbs and the clock."""

    @property
    def deliveries(self) -> DeliveryStore: ...

    def now(self) -> datetime: ...

PREFIX = "pys_agent_"
MAX_TOKEN_CHARS = 200
HINT_CHARS = len(PREFIX) + 6
AGENT_TOKEN_ENV = "PROMPTYOSELF_AGENT_TOKEN"
"""A process (stdio MCP server, the CLI) started with this variable acts as the token's agent."""


def looks_like(token: str | bytes) -> bool:
    """Whether a presented credential is an agent token (so it is looked up, never compared with the
    operator token)."""
    prefix = PREFIX.encode() if isinstance(token, bytes) else PREFIX
    return token.startswith(prefix) and len(token) <= MAX_TOKEN_CHARS  # type: ignore[arg-type]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


async def resolve(core: Core, token: str) -> str | None:
    """The agent a live agent token belongs to, or ``None`` (unknown, revoked, not an agent token)."""
    if not looks_like(token):
        return None
    return await core.deliveries.token_agent(hash_token(token))


def _agent(agent_id: object) -> str:
    agent = normalize_agent_id(agent_id)
    if agent is None:
        raise InvalidArgument("Name the agent: --agent-id ID.")
    return agent


async def mint(core: Core, agent_id: object, *, rotate: bool = False) -> dict[str, Any]:
    """A new token for the agent, shown once (only its hash is kept). With ``rotate`` the agent's
    live tokens are revoked in the same transaction."""
    agent = _agent(agent_id)
    token = PREFIX + secrets.token_urlsafe(32)
    row = await core.deliveries.add_agent_token(agent, hash_token(token), token[:HINT_CHARS], core.now(),
                                                revoke_others=rotate)
    verb = "Rotated" if rotate else "Minted"
    return {"status": "success", "id": row.id, "agent_id": agent, "token": token, "hint": row.hint,
            "message": f"{verb} an agent token for {agent}: it acts for {agent} only (its own schedules; no "
                       "approvals, policy or other agents). It is shown once; only its hash is kept."
                       + (" The agent's earlier tokens are revoked." if rotate else "")}


async def listing(core: Core, agent_id: object = None, *, include_revoked: bool = False) -> dict[str, Any]:
    agent = normalize_agent_id(agent_id)
    rows = await core.deliveries.agent_tokens(agent, include_revoked=include_revoked)
    return {"status": "success", "count": len(rows), "tokens": [
        {"id": r.id, "agent_id": r.agent_id, "hint": r.hint + "...", "created_at": r.created_at.isoformat(),
         "revoked_at": r.revoked_at.isoformat() if r.revoked_at else None} for r in rows]}


async def revoke(core: Core, *, agent_id: object = None, token_id: object = None) -> dict[str, Any]:
    """Revoke every live token of an agent, or one token by its id (``token list`` shows ids)."""
    agent = normalize_agent_id(agent_id)
    tid: int | None = None
    if token_id is not None:
        if isinstance(token_id, bool) or not isinstance(token_id, int | str) or not str(token_id).strip().isdigit():
            raise InvalidArgument("The token id is a whole number (`promptyoself token list` shows them).")
        tid = int(str(token_id).strip())
    if agent is None and tid is None:
        raise InvalidArgument("Name the agent (--agent-id ID) or the token (--id N).")
    count = await core.deliveries.revoke_agent_tokens(core.now(), agent_id=agent, token_id=tid)
    if count == 0:
        raise NotFound("No live agent token matches: `promptyoself token list` shows them.")
    return {"status": "success", "revoked": count, "agent_id": agent,
            "message": f"Revoked {count} agent token(s); requests with them are refused from now on."}


# ---- what an agent token may do --------------------------------------------------------------------


def own_agent(caller: str | None, named: object) -> object:
    """The agent a call acts for: the one named when the operator calls (``caller`` ``None``); the
    token's agent when an agent calls, which may name only itself (``Forbidden`` otherwise)."""
    if caller is None:
        return named
    try:
        given = normalize_agent_id(named)
    except InvalidArgument:
        given = str(named)
    if given is not None and given != caller:
        raise Forbidden(f"This agent token acts for {caller} only; it cannot act for {given[:100]}.")
    return caller


async def own_schedule(core: Core, caller: str | None, schedule_id: object) -> None:
    """An agent may touch its own schedules only: another agent's id is ``NotFound`` (as if it did not
    exist). The operator may touch any."""
    if caller is None:
        return
    from promptyoself.core.checks import parse_schedule_id

    sid = parse_schedule_id(schedule_id)
    row = await core.deliveries.schedule(sid)
    if row is None or row.agent_id != caller:
        raise NotFound(f"No schedule {sid} of agent {caller}.")


def operator_only(caller: str | None, what: str) -> None:
    if caller is not None:
        raise Forbidden(f"{what} needs the operator token (PROMPTYOSELF_HTTP_TOKEN); an agent token may only "
                        "create, list, pause, resume and cancel its own agent's schedules.")
