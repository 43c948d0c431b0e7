"""Where a new schedule goes (DESIGN §14): its target plug-in, agent id and target options.

1. The target: the one the call names (``target``); else the first plug-in, by name, that takes the
   options given and ``claims`` the call (from inside an agent CLI's session, an agent only one target
   holds); else ``registry.DEFAULT``.
2. Its options: ``target_options`` with the top-level aliases merged in, validated by the plug-in's own
   model (an unknown key or a bad value is ``InvalidArgument`` naming ``target_options.<key>``; nothing
   is stored).
3. The plug-in's ``destination`` turns the call into an agent id and the options stored with the
   schedule, or says what to pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from promptyoself.errors import InvalidArgument
from promptyoself.targets import registry
from promptyoself.targets.base import Call, TargetPlugin

if TYPE_CHECKING:
    from promptyoself.core.agents import CallContext
    from promptyoself.core.options import ScheduleOptions

ALIASES = ("conversation_id", "endpoint", "session_id", "cwd")
"""The top-level schedule options from before ``target_options`` (each is an option of one target)."""


@dataclass(frozen=True)
class Destination:
    agent_id: str
    target: str
    conversation_id: str | None = None
    options: str | None = None  # JSON object (schedules.target_options)
    validate: bool = False  # ask the plug-in whether the agent exists


def given(value: object) -> bool:
    """An argument that says something: not None and not a blank string."""
    return value is not None and not (isinstance(value, str) and not value.strip())


def _plugins() -> list[TargetPlugin]:
    found = []
    for name in registry.names():
        try:
            found.append(registry.plugin(name))
        except InvalidArgument:
            continue  # a plug-in that does not load claims nothing (health says why)
    return found


def _named(raw: object) -> str | None:
    if raw is not None and not isinstance(raw, str):
        raise InvalidArgument(f"target must be one of {', '.join(registry.names())}.")
    name = (raw or "").strip().lower() or None
    if name is not None and name not in registry.names():
        raise InvalidArgument(f"target must be one of {', '.join(registry.names())}, not {name[:40]!r}.",
                              reason="unknown_target")
    return name


def _owner(alias: str, plugins: list[TargetPlugin]) -> TargetPlugin | None:
    return next((p for p in plugins if alias in p.aliases), None)


def _validated(plugin: TargetPlugin, values: dict[str, Any]) -> Any:
    try:
        return plugin.options.model_validate(values)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(x) for x in first["loc"]) or "target_options"
        known = ", ".join(plugin.options.model_fields) or "none"
        raise InvalidArgument(f"target_options.{where}: {first['msg']} (target {plugin.name!r} takes: {known}).",
                              reason="bad_target_option") from None


def destination(options: ScheduleOptions, ctx: CallContext | None, resolve_agent: Callable[..., str],
                settings: Any, environ: Mapping[str, str] | None = None, *, operator: bool = True) -> Destination:
    """The destination of a scheduling call's ``options``; ``resolve_agent(agent_id, ctx)`` is the
    core's agent inference."""
    name = _named(options.target)
    aliased = {a: getattr(options, a) for a in ALIASES if given(getattr(options, a))}
    plugins = _plugins() if name is None or aliased else []
    extra = dict(options.target_options or {})

    def agent() -> str:
        return resolve_agent(options.agent_id, ctx)

    if name is None:
        for candidate in plugins:
            if candidate.name == registry.DEFAULT or not set(aliased) <= set(candidate.aliases):
                continue
            try:
                model = candidate.options.model_validate({**extra, **aliased})
            except ValidationError:
                continue
            if candidate.claims(Call(options.agent_id, model, settings, agent, environ, operator)):
                name = candidate.name
                break
    plugin = registry.plugin(name)
    for alias, value in aliased.items():
        if alias not in plugin.aliases:
            owner = _owner(alias, plugins or _plugins())
            where = f"{owner.name} schedules only (target '{owner.name}')" if owner else "no installed target"
            raise InvalidArgument(f"{alias} applies to {where}.")
        if alias in extra and extra[alias] != value:
            raise InvalidArgument(f"{alias} is given twice with different values (as an option and in "
                                  "target_options): give it once.")
        extra[alias] = value
    model = _validated(plugin, extra)
    dest = plugin.destination(Call(options.agent_id, model, settings, agent, environ, operator))
    stored = json.dumps(dict(dest.options), separators=(",", ":")) if dest.options else None
    return Destination(dest.agent_id, plugin.name, dest.conversation_id, stored, dest.validate)
