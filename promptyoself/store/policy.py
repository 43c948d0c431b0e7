"""The operator's policy: the guardrails every writer enforces, kept in the database (table ``policy``,
migration 0009) so that the CLI, MCP in process or over the relay, REST, Letta's scheduling API, the
native tools and the service's delivery all judge by the same values, whatever their own environment.

Seven values, each a row (name, value as text, source, updated_at):

* ``max_deliveries_per_agent_per_day``: the daily delivery budget per agent (0 = none);
* ``max_tokens_per_agent_per_day``: the daily token budget per agent, over what its receipts reported
  (0 = none);
* ``max_cost_usd_per_agent_per_day``: the daily cost budget per agent in USD, over what its receipts
  reported (0 = none);
* ``max_schedules_per_agent_per_hour``: schedules an agent may create per hour (0 = no limit);
* ``approval_below``: recurring schedules firing more often than this wait for approval (off = never);
* ``max_active_per_agent``: live (active or paused) schedules per agent (>= 1);
* ``pause_after_failures``: failed occurrences in a row after which delivery pauses a schedule (0 = never).

Where a value came from (``source``):

* ``operator``: set with ``promptyoself policy set``, the console or ``PUT /api/policy``; final.
* ``environment``: seeded from the environment variable (``PROMPTYOSELF_...``) of the first process
  that read the policy with that variable set; a later environment no longer changes it.
* ``default``: nobody chose; the built-in default. A process whose environment sets the variable
  replaces a ``default`` row once (it becomes ``environment``).

So the environment only seeds: default -> environment -> operator, never back.
"""

from __future__ import annotations

import re
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from promptyoself.config import Settings, parse_duration_or_off
from promptyoself.store.db import PolicyValue, Store
from promptyoself.store.queries import reading
from promptyoself.store.records import usd_text

MAX_ACTIVE_PER_AGENT = "max_active_per_agent"
MAX_SCHEDULES_PER_HOUR = "max_schedules_per_agent_per_hour"
MAX_DELIVERIES_PER_DAY = "max_deliveries_per_agent_per_day"
APPROVAL_BELOW = "approval_below"
PAUSE_AFTER_FAILURES = "pause_after_failures"
MAX_TOKENS_PER_DAY = "max_tokens_per_agent_per_day"
MAX_COST_PER_DAY = "max_cost_usd_per_agent_per_day"
NAMES = (MAX_DELIVERIES_PER_DAY, MAX_SCHEDULES_PER_HOUR, APPROVAL_BELOW, MAX_ACTIVE_PER_AGENT, PAUSE_AFTER_FAILURES,
         MAX_TOKENS_PER_DAY, MAX_COST_PER_DAY)
OPERATOR, ENVIRONMENT, DEFAULT = "operator", "environment", "default"
MAX_COUNT = 1_000_000
"""The largest count a policy value takes (a bound, like every input)."""
MAX_TOKENS = 10**12
"""The largest daily token budget."""
MAX_USD = 1_000_000
"""The largest daily cost budget, in USD."""
_USD = re.compile(r"\d{1,7}(\.\d{1,6})?|\.\d{1,6}")


def env_name(name: str) -> str:
    """The environment variable that seeds ``name`` (``PROMPTYOSELF_APPROVAL_BELOW`` ...)."""
    return str(Settings.model_fields[name].validation_alias)


ACCEPTS = {
    MAX_DELIVERIES_PER_DAY: "a whole number >= 0 (0 = no daily budget)",
    MAX_SCHEDULES_PER_HOUR: "a whole number >= 0 (0 = no limit)",
    APPROVAL_BELOW: "a duration such as 30m, 1h or 90, or off",
    MAX_ACTIVE_PER_AGENT: "a whole number >= 1",
    PAUSE_AFTER_FAILURES: "a whole number >= 0 (0 = never pause for failures)",
    MAX_TOKENS_PER_DAY: "a whole number >= 0 (0 = no token budget)",
    MAX_COST_PER_DAY: "a number of US dollars >= 0 with at most 6 decimals, such as 2.50 (0 = no cost budget)",
}


def parse(name: str, value: object) -> int | float | timedelta | None:
    """The typed value of policy ``name`` from its text (or a number); ``ValueError`` saying what it
    accepts when it is not one (``KeyError`` for an unknown name)."""
    if name not in ACCEPTS:
        raise KeyError(name)
    if name == APPROVAL_BELOW:
        try:
            return parse_duration_or_off(value.strip() if isinstance(value, str) else value)
        except ValueError:
            raise ValueError(f"{name} takes {ACCEPTS[name]}.") from None
    if name == MAX_COST_PER_DAY:
        return _usd(name, value)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{name} takes {ACCEPTS[name]}.")
    text = value.strip() if isinstance(value, str) else str(value)
    most = MAX_TOKENS if name == MAX_TOKENS_PER_DAY else MAX_COUNT
    if not text.isascii() or not text.isdigit() or len(text) > len(str(most)):
        raise ValueError(f"{name} takes {ACCEPTS[name]} (at most {most:,}).")
    number = int(text)
    low = 1 if name == MAX_ACTIVE_PER_AGENT else 0
    if not low <= number <= most:
        raise ValueError(f"{name} takes {ACCEPTS[name]} (at most {most:,}).")
    return number


def _usd(name: str, value: object) -> float:
    """A cost budget: a decimal number of USD (text, an int or a float), at most ``MAX_USD``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{name} takes {ACCEPTS[name]}.")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{name} takes {ACCEPTS[name]}.")
        text = f"{value:.6f}" if value >= 0 else "-"
    else:
        text = value.strip() if isinstance(value, str) else str(value)
    if not text.isascii() or not _USD.fullmatch(text):
        raise ValueError(f"{name} takes {ACCEPTS[name]} (at most {MAX_USD:,}).")
    number = round(float(text), 6)
    if not 0 <= number <= MAX_USD:
        raise ValueError(f"{name} takes {ACCEPTS[name]} (at most {MAX_USD:,}).")
    return number


def text_of(name: str, value: int | float | timedelta | None) -> str:
    """The stored text of a typed value (``off`` for no approval; a duration as its setting prints)."""
    if name == APPROVAL_BELOW:
        return "off" if value is None else str(parse_duration_or_off(value))
    if name == MAX_COST_PER_DAY and isinstance(value, int | float):
        return usd_text(float(value))
    return str(value)


@dataclass(frozen=True)
class Entry:
    value: str
    source: str
    """operator | environment | default"""
    updated_at: datetime


@dataclass(frozen=True)
class Policy:
    """The guardrails as every writer enforces them, with each value's origin."""

    max_deliveries_per_agent_per_day: int
    max_schedules_per_agent_per_hour: int
    approval_below: timedelta | None
    max_active_per_agent: int
    entries: Mapping[str, Entry]
    pause_after_failures: int = 5
    max_tokens_per_agent_per_day: int = 0
    max_cost_usd_per_agent_per_day: float = 0.0


def seeds(settings: Settings) -> dict[str, tuple[str, str]]:
    """Per name, the value a fresh row takes from ``settings`` and its source: ``environment`` when
    the setting was given (environment, ``.env`` or an override), else ``default``."""
    given = settings.model_fields_set
    return {name: (text_of(name, getattr(settings, name)), ENVIRONMENT if name in given else DEFAULT)
            for name in NAMES}


def of_settings(settings: Settings, now: datetime, rows: Mapping[str, Entry] | None = None) -> Policy:
    """The policy a store without a database holds (``store.memory``): the operator's ``rows`` (what
    ``policy set`` wrote there), every other value ``settings``'s seed."""
    return _typed(rows or {}, seeds(settings), now)


_cache: weakref.WeakKeyDictionary[Store, tuple[float, Policy]] = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def cached(store: Store, max_age: float) -> Policy | None:
    """The policy this process read from ``store`` less than ``max_age`` seconds ago, or None (no I/O:
    the async store answers a hit on its event loop, a miss with ``load`` in its thread)."""
    if max_age <= 0:
        return None
    with _cache_lock:
        hit = _cache.get(store)
    return hit[1] if hit is not None and time.monotonic() - hit[0] < max_age else None


def load(store: Store, settings: Settings, now: datetime, *, max_age: float = 0.0) -> Policy:
    """The stored policy; missing rows are seeded from ``settings`` first (and ``default`` rows that
    this process's environment sets are replaced once). ``max_age`` > 0 lets a hot path (delivery's
    budget check) reuse a value read that many seconds ago in this process."""
    hit = cached(store, max_age)
    if hit is not None:
        return hit
    wanted = seeds(settings)
    rows = _read(store)
    stale = [n for n in NAMES if n not in rows
             or (rows[n].source == DEFAULT and wanted[n][1] == ENVIRONMENT and rows[n].value != wanted[n][0])]
    if stale:
        _seed(store, {n: wanted[n] for n in stale}, rows, now)
        rows = _read(store)
    policy = _typed(rows, wanted, now)
    with _cache_lock:
        _cache[store] = (time.monotonic(), policy)
    return policy


def save(store: Store, settings: Settings, changes: Mapping[str, int | float | timedelta | None],
         now: datetime) -> Policy:
    """Write the operator's values (typed, checked by ``parse``) in one transaction; source ``operator``."""
    load(store, settings, now)  # every row exists
    with store.session() as s:
        for name, value in changes.items():
            s.execute(update(PolicyValue).where(PolicyValue.name == name)
                      .values(value=text_of(name, value), source=OPERATOR, updated_at=now))
    with _cache_lock:
        _cache.pop(store, None)
    return load(store, settings, now)


_P = PolicyValue.__table__.c
_READ = select(_P.name, _P.value, _P.source, _P.updated_at)


def _read(store: Store) -> dict[str, Entry]:
    with reading(store) as conn:  # one statement (PostgreSQL: no BEGIN and COMMIT around it)
        return {name: Entry(value, source, at) for name, value, source, at in conn.execute(_READ)}


def _insert(dialect: str) -> Any:
    """The dialect's own INSERT (it has ON CONFLICT), imported here: the engine imports only its own
    dialect, and the PostgreSQL one costs a SQLite process (a CLI call) ~20 ms."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert


def _seed(store: Store, values: Mapping[str, tuple[str, str]], rows: Mapping[str, Entry], now: datetime) -> None:
    insert = _insert(store.dialect)
    with store.session() as s:
        for name, (value, source) in values.items():
            if name in rows:  # a default row this environment sets: once, and only while still default
                s.execute(update(PolicyValue).where(PolicyValue.name == name, PolicyValue.source == DEFAULT)
                          .values(value=value, source=source, updated_at=now))
            else:  # another process may seed at the same moment: the first row stays
                s.execute(insert(PolicyValue).values(name=name, value=value, source=source, updated_at=now)
                          .on_conflict_do_nothing(index_elements=["name"]))


def _typed(rows: Mapping[str, Entry], wanted: Mapping[str, tuple[str, str]], now: datetime) -> Policy:
    values: dict[str, int | float | timedelta | None] = {}
    entries: dict[str, Entry] = {}
    for name in NAMES:
        entry = rows.get(name) or Entry(wanted[name][0], wanted[name][1], now)
        try:
            values[name] = parse(name, entry.value)
        except ValueError:  # a row edited by hand into nonsense: the seed, and say so
            entry = Entry(wanted[name][0], DEFAULT, now)
            values[name] = parse(name, entry.value)
        entries[name] = entry
    deliveries, hourly, active = (values[MAX_DELIVERIES_PER_DAY], values[MAX_SCHEDULES_PER_HOUR],
                                  values[MAX_ACTIVE_PER_AGENT])
    below, failures = values[APPROVAL_BELOW], values[PAUSE_AFTER_FAILURES]
    assert isinstance(deliveries, int) and isinstance(hourly, int) and isinstance(active, int)
    assert below is None or isinstance(below, timedelta)
    tokens, cost = values[MAX_TOKENS_PER_DAY], values[MAX_COST_PER_DAY]
    assert isinstance(failures, int) and isinstance(tokens, int) and isinstance(cost, float)
    return Policy(deliveries, hourly, below, active, entries, failures, tokens, cost)
