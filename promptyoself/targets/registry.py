"""Which plug-in delivers to which ``target`` (DESIGN §14, issue 41 point 1).

A target is a plug-in: an object of the ``TargetPlugin`` protocol (``targets/base.py``) that a
distribution declares in the entry point group ``promptyoself.targets``::

    [project.entry-points."promptyoself.targets"]
    jsonl = "my_package.jsonl:plugin"

The four built-in targets are declared the same way in our own pyproject.toml. Only the entry points'
names are read at start-up: a plug-in's module is imported the first time something asks for that
target (a schedule goes there, health looks at it), so a heavy client costs nothing until then. A
plug-in that fails to load is kept as a name with its error: health reports it, and a schedule naming
it is refused with that error; nothing else is affected.

``register`` adds one at run time (tests, an embedding program): a plug-in object, or a factory that
takes ``Settings`` and returns a ``DeliveryTarget`` (wrapped as a plug-in with no options).

An agent CLI's plug-in may run the stdio MCP server itself (Claude Code's adds its live channel when
this server is a Claude Code plugin): it declares that hook in the group ``promptyoself.stdio``
(``stdio_hooks``), read in the same pass as the targets, so that deciding how to serve stdio loads no
plug-in. Likewise a plug-in whose settings hold secrets declares the function that lists them in the group
``promptyoself.secrets`` (``secrets``): the log filter asks it with the process's first line, which
loads no plug-in either.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

from promptyoself.errors import InvalidArgument

if TYPE_CHECKING:  # targets.base is imported where a plug-in is loaded or made: names() does not need it
    from promptyoself.targets.base import Call, DeliveryTarget, Destination, TargetPlugin, Watch

log = logging.getLogger(__name__)

GROUP = "promptyoself.targets"
DEFAULT = "letta"
SLOT_CAPS: dict[str, int] = {"claude-code": 8}
"""Targets whose every send is a heavy local process (a ``claude`` turn): at most this many send slots
unless ``PROMPTYOSELF_TARGET_IN_FLIGHT`` names the target, whatever ``PROMPTYOSELF_MAX_IN_FLIGHT`` says
(its default, 32, is sized for HTTP targets: issue 42 finding 15). ``delivery.holdings`` reads it."""
"""A schedule with no target (rows older than the column, a call that names none and that no plug-in
claims) goes to the Letta REST API."""

Factory = Callable[[Any], "DeliveryTarget"]

BUILT_IN: dict[str, str] = {
    "letta": "promptyoself.targets.letta.plugin:plugin",
    "letta-code": "promptyoself.targets.letta_code.plugin:plugin",
    "claude-code": "promptyoself.targets.claude_code.plugin:plugin",
    "webhook": "promptyoself.targets.webhook.plugin:plugin",
    "codex": "promptyoself.targets.codex.plugin:plugin",
}
"""Our own entry points (pyproject.toml declares the same; ``tests/test_plugins.py`` checks): used as
they are when this package runs from a source tree that was never installed (no metadata to read)."""

STDIO_GROUP = "promptyoself.stdio"
BUILT_IN_STDIO: dict[str, str] = {
    "claude-code": "promptyoself.targets.claude_code.channel_server:serve_stdio",
}
"""Our own ``promptyoself.stdio`` entry points, as ``BUILT_IN`` is for the targets: ``name =
"module:function"``, where ``function(mcp)`` runs the stdio MCP server and returns True when it applies
to this process, else returns False at once. Every stdio server start asks each, before its handshake:
importing the module and deciding must be cheap."""


SECRETS_GROUP = "promptyoself.secrets"
BUILT_IN_SECRETS: dict[str, str] = {
    "webhook": "promptyoself.targets.webhook.settings:configured_endpoint_secrets",
}
"""Our own ``promptyoself.secrets`` entry points: ``name = "module:function"``, where ``function()``
returns the secrets the target's settings hold (``list[str]``). Asked with the first log line of
every process: importing the module must be cheap (a settings module, not the plug-in)."""


def _no_options() -> type[Any]:
    """The options model of a target that takes none (pydantic imported only when one is made: the
    CLI's ``--help`` reads the registry on the standard library)."""
    from pydantic import BaseModel, ConfigDict

    class NoOptions(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

    return NoOptions


@dataclass
class FactoryPlugin:
    """A plug-in made of a bare factory (``register(name, factory)``): no options, destinations are
    agents as the core infers them, probed under the generic ``target_unreachable``."""

    name: str
    factory: Factory
    summary: str = "a target registered at run time"
    options: type[Any] = field(default_factory=_no_options)
    aliases: tuple[str, ...] = ()

    def claims(self, call: Call) -> bool:
        return False

    def destination(self, call: Call) -> Destination:
        from promptyoself.targets.base import Destination

        return Destination(call.agent())

    async def validate(self, core: Any, agent_id: str) -> None:
        return None

    def create(self, settings: Any) -> DeliveryTarget:
        return self.factory(settings)

    def watch(self, settings: Any) -> Watch:
        from promptyoself.targets.base import Watch

        return Watch("target_unreachable", "Check the target's receiver and its settings, then run "
                     "`promptyoself health` again.")


@dataclass
class _Entry:
    value: str | TargetPlugin
    error: str | None = None
    overlap: OverlapSupport | None = None  # what the loaded plug-in says of overlap, read once


_lock = threading.Lock()
_declared: Declared | None = None  # the entry points: targets, stdio hooks, secret sources
_added: dict[str, _Entry] = {}
_merged: dict[str, _Entry] | None = None  # the two above as one table (a list answer asks it per row)


Declared = tuple[dict[str, "_Entry"], dict[str, str], dict[str, str]]
"""The targets, the stdio hooks and the secret sources, as declared."""


def _discover() -> Declared:
    found: dict[str, _Entry] = {}
    try:  # one pass over the installed distributions for the three groups (it reads every one's entry points)
        declared = metadata.entry_points()
        points, hooks = list(declared.select(group=GROUP)), list(declared.select(group=STDIO_GROUP))
        sources = list(declared.select(group=SECRETS_GROUP))
    except Exception:  # unreadable metadata: the built-ins still work
        log.warning("reading the %s entry points failed", GROUP, exc_info=True)
        points, hooks, sources = [], [], []
    for point in points:
        name = point.name
        if name != name.strip().lower() or not name or len(name) > 40:
            log.warning("ignoring the target entry point %r: a name is lower case, at most 40 characters", name)
        elif name in found:
            log.warning("target %r is declared twice; %s is ignored", name, point.value)
        else:
            found[name] = _Entry(point.value)
    for name, value in BUILT_IN.items():
        found.setdefault(name, _Entry(value))  # a source tree never installed has no metadata of ours
    return found, _by_name(hooks, BUILT_IN_STDIO), _by_name(sources, BUILT_IN_SECRETS)


def _by_name(points: list[Any], built_in: dict[str, str]) -> dict[str, str]:
    """``name -> "module:function"`` of a group's entry points, the first of a name kept, then our
    built-ins where no distribution declared that name (a source tree never installed has no metadata)."""
    named: dict[str, str] = {}
    for point in points:
        named.setdefault(point.name, point.value)
    for name, value in built_in.items():
        named.setdefault(name, value)
    return named


def _read() -> Declared:
    """The declared targets, stdio hooks and secret sources, read once (called under ``_lock``)."""
    global _declared
    if _declared is None:
        _declared = _discover()
    return _declared


def _table() -> dict[str, _Entry]:
    global _merged
    with _lock:
        if _merged is None:
            _merged = {**_read()[0], **_added}
        return _merged


def reload() -> None:
    """Read the entry points again (a distribution installed while this process runs; tests)."""
    global _declared, _merged
    with _lock:
        _declared = _merged = None


def stdio_hooks() -> list[Callable[[Any], bool]]:
    """The ``promptyoself.stdio`` hooks (``BUILT_IN_STDIO``), imported, in name order; one that does not
    import is logged and left out (the plain stdio server then runs)."""
    with _lock:
        declared = sorted(_read()[1].items())
    found: list[Callable[[Any], bool]] = []
    for name, value in declared:
        try:
            hook = _imported(value)
            if not callable(hook):
                raise TypeError(f"{value} is not callable")
        except Exception as exc:
            log.error("the stdio hook %r (%s) failed to load: %s: %s", name, value, type(exc).__name__, str(exc)[:300])
            continue
        found.append(hook)
    return found


def register(name: str, plugin: TargetPlugin | Factory | str) -> None:
    """Add (or replace) the target ``name``: a plug-in object, a ``Settings -> DeliveryTarget`` factory,
    or ``"module:attribute"`` naming either, imported on first use."""
    from promptyoself.targets.base import TargetPlugin

    if not name or name != name.strip().lower():
        raise ValueError(f"a target name is lower case without spaces, not {name!r}")
    global _merged
    with _lock:
        _added[name] = _Entry(plugin if isinstance(plugin, str | TargetPlugin) else FactoryPlugin(name, plugin))
        _merged = None


def unregister(name: str) -> None:
    """Forget a target added by ``register`` (a declared one comes back as it was)."""
    global _merged
    with _lock:
        _added.pop(name, None)
        _merged = None


def names() -> tuple[str, ...]:
    """Every target a schedule may name (those that failed to load included: naming one says why), sorted."""
    return tuple(sorted(_table()))


def _load(name: str, entry: _Entry) -> TargetPlugin:
    if not isinstance(entry.value, str):
        return entry.value
    from promptyoself.targets.base import TargetPlugin
    try:
        found: Any = _imported(entry.value)
        if not isinstance(found, TargetPlugin):
            if callable(found) and not isinstance(found, type):
                found = FactoryPlugin(name, found)
            else:
                raise TypeError(f"{entry.value} is not a target plug-in (see docs/plugins.md)")
        if found.name != name:
            raise TypeError(f"{entry.value} calls itself {found.name!r}, not {name!r}")
    except Exception as exc:
        entry.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        log.error("the target plug-in %r (%s) failed to load: %s", name, entry.value, entry.error)
        raise
    entry.value = found
    entry.error = None
    return found


def plugin(name: str | None) -> TargetPlugin:
    """The plug-in of ``name`` (``DEFAULT`` for None). ``InvalidArgument`` for a name nobody declared, or
    one whose plug-in failed to load (with its error)."""
    key = name or DEFAULT
    entry = _table().get(key)
    if entry is None:
        raise InvalidArgument(f"Unknown target {key[:40]!r}; the targets are: {', '.join(names())}.",
                              reason="unknown_target")
    try:
        found = _load(key, entry)
    except Exception:
        raise InvalidArgument(f"Target {key!r} is installed but its plug-in failed to load: {entry.error}. "
                              "See `promptyoself targets`.", reason="target_broken") from None
    wrong = settings_error(found)
    if wrong is not None:
        raise InvalidArgument(f"Target {key!r} is installed but its settings are invalid: {wrong}. "
                              "See `promptyoself targets`.", reason="target_broken")
    return found


def loaded(name: str) -> TargetPlugin | None:
    """The plug-in of ``name`` when its module loads, whether or not its settings are valid (which
    target a call is for is asked of every plug-in; ``plugin`` then refuses a misconfigured one, saying
    why, rather than the call going elsewhere); None when it does not load."""
    entry = _table().get(name)
    if entry is None:
        return None
    try:
        return _load(name, entry)
    except Exception:
        return None


def settings_error(found: TargetPlugin) -> str | None:
    """What is wrong with the plug-in's own settings (its optional ``config()``, read from the environment
    and the ``.env`` file, raises naming the variable), or None. Asked on each use: the settings are
    cached by their reader until the environment or the file changes."""
    read = getattr(found, "config", None)
    if not callable(read):
        return None
    try:
        read()
    except Exception as exc:
        text = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        return str(text)[:600]
    return None


def problems() -> dict[str, str]:
    """``{name: error}`` of every declared plug-in that does not load, or whose own settings are invalid
    (each is tried: cheap, the plug-in modules import no heavy client)."""
    out: dict[str, str] = {}
    for name, entry in _table().items():
        try:
            found = _load(name, entry)
        except Exception:
            out[name] = entry.error or "failed to load"
            continue
        wrong = settings_error(found)
        if wrong is not None:
            out[name] = f"its settings are invalid: {wrong}"
    return out


def secrets() -> list[str]:
    """Every secret the targets' own settings hold, for the log filter and the history's redaction: what
    each declared secret source returns (``promptyoself.secrets``: the webhook endpoints' signing secrets
    and URL credentials), imported without loading any plug-in; and what each plug-in already loaded in
    this process gives (its optional ``secrets()``). A source that fails adds nothing."""
    with _lock:
        sources = sorted(_read()[2].items())
    found: list[str] = []
    for name, value in sources:
        try:
            found.extend(str(s) for s in _imported(value)() if s)
        except Exception:
            log.debug("the secret source %r (%s) gave no secrets", name, value, exc_info=True)
    for name, entry in _table().items():
        hook = getattr(entry.value, "secrets", None) if not isinstance(entry.value, str) else None
        if callable(hook):
            try:
                found.extend(str(s) for s in hook() if s)
            except Exception:
                log.debug("the target %r gave no secrets", name, exc_info=True)
    return list(dict.fromkeys(found))


def _imported(value: str) -> Any:
    """The object an entry point's ``"module:attribute"`` names, imported."""
    module, _, attribute = value.partition(":")
    found: Any = importlib.import_module(module)
    for part in attribute.split(".") if attribute else ():
        found = getattr(found, part)
    return found


def shown(settings: Any) -> dict[str, Any]:
    """What the plug-ins add to health's answer (their optional ``shown(settings)``: the Letta Code
    target's URL, redacted), merged; a plug-in that does not load or fails adds nothing."""
    out: dict[str, Any] = {}
    for name in names():
        found = loaded(name)
        hook = getattr(found, "shown", None)
        if callable(hook):
            try:
                out.update(hook(settings))
            except Exception:
                log.debug("the target %r showed nothing", name, exc_info=True)
    return out


async def validate(name: str | None, core: Any, agent_id: str) -> None:
    """The plug-in's ``validate``: awaited on this loop when it is a coroutine function (the built-in
    ones), else run in a thread (a blocking one, as an outside plug-in may have written it)."""
    check = plugin(name).validate
    if inspect.iscoroutinefunction(check):
        await check(core, agent_id)
    else:
        await asyncio.to_thread(check, core, agent_id)


def factory(name: str | None) -> Factory:
    """``Settings -> DeliveryTarget`` for ``name`` (the plug-in's ``create``)."""
    return plugin(name).create


def create(name: str | None, settings: Any) -> DeliveryTarget:
    """A new ``DeliveryTarget`` for ``name``, configured from ``settings``."""
    return plugin(name).create(settings)


@dataclass(frozen=True)
class OverlapSupport:
    """What a target says of overlap (issue 43 point 3): the policy its new schedules get by default,
    and what "still running" means for it (None: it cannot tell, so its schedules behave as allow)."""

    default: str
    busy_check: str | None


def overlap_support(name: str | None) -> OverlapSupport:
    """The plug-in's optional ``default_overlap`` and ``busy_check`` (``TargetPlugin``'s docstring);
    ``allow`` and None when it declares neither, or does not load."""
    from promptyoself.targets.base import OVERLAP_POLICIES

    key = name or DEFAULT
    entry = _table().get(key)
    if entry is not None and entry.overlap is not None:  # read once per plug-in: a list asks per row
        return entry.overlap
    try:
        found = plugin(key)
    except InvalidArgument:
        return OverlapSupport("allow", None)
    default = getattr(found, "default_overlap", None)
    check = getattr(found, "busy_check", None)
    support = OverlapSupport(default if default in OVERLAP_POLICIES else "allow",
                             str(check)[:200] if isinstance(check, str) and check.strip() else None)
    if entry is not None:
        entry.overlap = support
    return support


def overlap_policy(stored: str | None, target: str | None) -> str:
    """A schedule's overlap policy: the one stored with it, else its target's default (a row from
    before 0014_overlap)."""
    from promptyoself.targets.base import OVERLAP_POLICIES

    return stored if stored in OVERLAP_POLICIES else overlap_support(target).default


def overlap_note(stored: str | None, target: str | None) -> str | None:
    """What a schedule's description adds about its overlap policy: that its target cannot tell whether
    a turn is running, so its occurrences are sent as ``allow`` whatever the policy asked; None when
    the policy is ``allow`` or the target can tell."""
    from promptyoself.targets.base import OVERLAP_POLICIES

    support = overlap_support(target)
    policy = stored if stored in OVERLAP_POLICIES else support.default
    if policy == "allow" or support.busy_check is not None:
        return None
    return (f"overlap={policy} asked, but the {target or DEFAULT} target cannot tell whether a turn is still "
            "running: sent anyway (as allow)")
