"""How the command line shows a result on a terminal (``promptyoself.faces.cli`` prints JSON otherwise).

- Lists (schedules, deliveries, agents, executed prompts) are tables. Ids are never cut: an agent id
  is 42 characters and two agents differ at its end. Long text (a prompt, an error) is wrapped onto
  more lines of its cell to fit the terminal's width, never cut.
- Instants are shown in the schedule's own timezone (a row's ``timezone``; else the one given, which
  is ``PROMPTYOSELF_TIMEZONE``), to the second, with the offset and the zone's abbreviation:
  ``2026-11-24 09:00:00 +01:00 CET`` (a schedule's ``upcoming`` runs too).
- Everything else is ``key  value`` lines; nested objects (the worker lease, health's executor) are
  flattened to ``worker.pid``-style keys, so no JSON is printed on a terminal. A missing value is
  ``-`` and nothing prints Python's ``None``, ``True`` or ``False``.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from promptyoself import timing

ROW_COLUMNS: dict[str, tuple[str, ...]] = {
    "schedules": ("id", "agent_id", "schedule_type", "schedule_value", "timezone", "state", "next_run", "prompt_text"),
    "deliveries": ("schedule_id", "scheduled_for", "attempted_at", "outcome", "attempt", "lateness_s", "error"),
    "agents": ("id", "name", "created_at", "last_updated"),
    "executed": ("id", "agent_id", "outcome", "delivered", "next_run", "repetition_count", "error"),
}
"""The columns of each list a result may hold (the first list found is the table)."""

WRAPPED = frozenset({"prompt_text", "error"})
"""Columns whose text wraps to fit the terminal (each is the last of its table); every other column
keeps its width, so an id is never cut."""
TIMES = frozenset({
    "next_run", "next_due", "last_run", "last_tick", "scheduled_for", "attempted_at", "created_at", "last_updated",
    "started_at", "heartbeat_at", "lease_until", "updated_at", "upcoming",
})
HIDDEN = frozenset({"next_run_local"})
"""Keys a terminal does not need: ``next_run_local`` repeats ``next_run``, which is already shown in
the schedule's timezone. (``status: success`` is left out too; health's ``ok|degraded|down`` stays.)"""
MIN_WRAP = 30
INDENT = "    "
GAP = "  "


def terminal_width() -> int:
    return max(40, shutil.get_terminal_size((100, 24)).columns)


def show_time(value: str, zone: ZoneInfo) -> str:
    """``2026-11-24T08:00:00.123456+00:00`` in Europe/Berlin -> ``2026-11-24 09:00:00 +01:00 CET``."""
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return value
    if when.tzinfo is None:
        return value
    local = when.astimezone(zone).replace(microsecond=0)
    offset = local.strftime("%z")
    name = local.tzname() or ""
    named = f" {name}" if name.isalpha() else ""  # 'CET', 'UTC'; not '+03', which repeats the offset
    return f"{local:%Y-%m-%d %H:%M:%S} {offset[:3]}:{offset[3:]}{named}"


def show(key: str, value: Any, zone: ZoneInfo, row: Mapping[str, Any] | None = None) -> str:
    """One value as a terminal shows it."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}s" if key.endswith("_s") or key == "lateness_s" else f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(show(key, v, zone) for v in value) or "-"
    text = str(value)
    once = row is not None and key == "schedule_value" and row.get("schedule_type") == "once"
    if key in TIMES or once:
        return show_time(text, zone)
    return text


def row_zone(row: Mapping[str, Any], zone: ZoneInfo) -> ZoneInfo:
    name = row.get("timezone")
    if isinstance(name, str) and name:
        try:
            return timing.resolve_zone(name, zone.key)
        except Exception:  # an unknown stored zone: show the instant in the default one
            return zone
    return zone


def render(result: Mapping[str, Any], zone: ZoneInfo | None = None, width: int | None = None) -> str:
    """A result as text for a terminal."""
    zone = zone or ZoneInfo("UTC")
    width = width or terminal_width()
    for key, columns in ROW_COLUMNS.items():
        rows = result.get(key)
        if isinstance(rows, list):
            of = f" for agent {result['agent_id']}" if result.get("agent_id") else ""
            lines = table(columns, rows, zone, width) if rows else [] if key == "executed" else [f"No {key}{of}."]
            rest = {k: v for k, v in result.items() if k != key}
            return "\n".join([*lines, *footer(key, len(rows), rest, zone)])
    return "\n".join(key_values(result, zone, width))


def table(columns: tuple[str, ...], rows: list[Any], zone: ZoneInfo, width: int) -> list[str]:
    """Rows under a header. The wrapped column (the last) takes what room is left; with less than
    ``MIN_WRAP`` characters left it moves under its row instead, indented, at the terminal's width."""
    cells = [[show(c, r.get(c), row_zone(r, zone), r).replace("\n", " ") for c in columns] for r in rows]
    heads = [c.upper() for c in columns]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(heads)]
    last = len(columns) - 1
    below = False
    if columns[last] in WRAPPED:
        room = width - sum(widths[:last]) - len(GAP) * last
        if room >= MIN_WRAP:
            widths[last] = min(widths[last], room)
        else:
            below = True
            heads, widths = heads[:last], widths[:last]
    lines = [GAP.join(h.ljust(w) for h, w in zip(heads, widths, strict=False)).rstrip()]
    for row in cells:
        if below:
            lines.append(GAP.join(v.ljust(w) for v, w in zip(row, widths, strict=False)).rstrip())
            if row[last] not in ("", "-"):
                lines.extend(textwrap.wrap(row[last], max(MIN_WRAP, width - len(INDENT)), initial_indent=INDENT,
                                           subsequent_indent=INDENT, break_long_words=False, break_on_hyphens=False))
            continue
        parts = [_wrap(v, w) if c in WRAPPED else [v] for c, v, w in zip(columns, row, widths, strict=True)]
        for n in range(max(len(p) for p in parts)):
            line = GAP.join((p[n] if n < len(p) else "").ljust(w) for p, w in zip(parts, widths, strict=True))
            lines.append(line.rstrip())
    return lines


def _wrap(text: str, width: int) -> list[str]:
    """Words are never broken: an id inside an error stays whole (and may overhang its column)."""
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]


def footer(key: str, shown: int, rest: Mapping[str, Any], zone: ZoneInfo) -> list[str]:
    """What a list result says besides its rows: counts in words, the message, any other field."""
    out: list[str] = []
    total = rest.get("total")
    if isinstance(total, int) and total:
        who = f"agent {rest['agent_id']}" if rest.get("agent_id") else "all agents"
        out.append(f"{shown} of {total} {key} shown ({who}).")
    if rest.get("message"):
        out.append(str(rest["message"]))
    others = {k: v for k, v in rest.items() if k not in {"count", "total", "agent_id", "message", "status", *HIDDEN}}
    out.extend(f"{k}: {show(k, v, zone)}" for k, v in flatten(others) if v is not None)
    return out


def flatten(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``{"worker": {"pid": 1}}`` -> ``("worker.pid", 1)``; lists of objects get ``[i]``."""
    for k, v in values.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            if v:
                yield from flatten(v, name + ".")
            else:
                yield name, None
        elif isinstance(v, list) and any(isinstance(x, Mapping) for x in v):
            for i, x in enumerate(v):
                if isinstance(x, Mapping):
                    yield from flatten(x, f"{name}[{i}].")
                else:
                    yield f"{name}[{i}]", x
        else:
            yield name, v


def key_values(result: Mapping[str, Any], zone: ZoneInfo, width: int) -> list[str]:
    """A single object: its message first, then ``key  value`` lines (long values wrapped)."""
    zone = row_zone(result, zone)
    lines = [str(result["message"])] if result.get("message") else []
    kept = {k: v for k, v in result.items() if k not in HIDDEN | {"message"} and (k, v) != ("status", "success")}
    pairs = list(flatten(kept))
    if not pairs:
        return lines
    keys = max(len(k) for k, _ in pairs)
    room = max(MIN_WRAP, width - keys - len(GAP))
    for k, v in pairs:
        text = show(k.rsplit(".", 1)[-1], v, zone, result).replace("\n", " ")
        chunks = textwrap.wrap(text, room, break_long_words=False, break_on_hyphens=False) or [text]
        lines.append(f"{k.ljust(keys)}{GAP}{chunks[0]}".rstrip())
        lines.extend(f"{'':{keys}}{GAP}{c}" for c in chunks[1:])
    return lines
