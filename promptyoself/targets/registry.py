"""Which module delivers to which ``target`` (issue 30 point 3): a schedule's ``target`` column is a
name here, and the engine asks ``create(name, settings)`` for the ``DeliveryTarget`` behind it.

A new target is one module in ``promptyoself/targets/`` and one line in ``BUILT_IN`` below
(``"name": "promptyoself.targets.module:factory"``; the factory takes ``Settings`` and returns a
``DeliveryTarget``). Entries are imported on first use, so naming a target costs nothing at start-up
and a target whose client library is heavy imports it only when a schedule goes there. ``register``
adds one at run time (tests, an embedding program).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable

from promptyoself.config import Settings
from promptyoself.errors import InvalidArgument
from promptyoself.targets.base import DeliveryTarget

Factory = Callable[[Settings], DeliveryTarget]

LETTA = "letta"
LETTA_CODE = "letta-code"
DEFAULT = LETTA
"""A schedule with no target (rows older than the column) goes to the Letta REST API."""

BUILT_IN: dict[str, str] = {
    LETTA: "promptyoself.targets.letta_rest:LettaRestTarget",
    LETTA_CODE: "promptyoself.targets.letta_code:LettaCodeTarget",
    "webhook": "promptyoself.targets.webhook:WebhookTarget",
    "claude-code": "promptyoself.targets.claude_code:ClaudeCodeTarget",
}

_lock = threading.Lock()
_factories: dict[str, str | Factory] = dict(BUILT_IN)


def register(name: str, factory: str | Factory) -> None:
    """Add (or replace) the target ``name``: a factory, or ``"module:attribute"`` imported on first use."""
    if not name or name != name.strip().lower():
        raise ValueError(f"a target name is lower case without spaces, not {name!r}")
    with _lock:
        _factories[name] = factory


def unregister(name: str) -> None:
    """Forget ``name`` (a test's own target); a built-in one comes back as it was."""
    with _lock:
        if name in BUILT_IN:
            _factories[name] = BUILT_IN[name]
        else:
            _factories.pop(name, None)


def names() -> tuple[str, ...]:
    """Every target a schedule may name, sorted."""
    with _lock:
        return tuple(sorted(_factories))


def factory(name: str | None) -> Factory:
    """The factory of ``name`` (``DEFAULT`` for None); ``InvalidArgument`` for a name nobody registered."""
    key = name or DEFAULT
    with _lock:
        found = _factories.get(key)
    if found is None:
        raise InvalidArgument(f"Unknown target {key!r}; the targets are: {', '.join(names())}.")
    if isinstance(found, str):
        module, _, attribute = found.partition(":")
        resolved: Factory = getattr(importlib.import_module(module), attribute)
        with _lock:
            if _factories.get(key) == found:
                _factories[key] = resolved
        return resolved
    return found


def create(name: str | None, settings: Settings) -> DeliveryTarget:
    """A new ``DeliveryTarget`` for ``name``, configured from ``settings``."""
    return factory(name)(settings)
