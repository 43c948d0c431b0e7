"""How the command line shows a result on a terminal (``promptyoself.faces.cli`` prints JSON otherwise).

- Lists (schedules, deliveries, agents, executed prompts) are tables that fit the terminal's width.
  Ids are never cut: an agent id is 42 characters and two agents differ at its end. Long text (a
  prompt, an error) is wrapped onto more lines of its cell, never cut. When the columns do not fit
  side by side, the ids and the columns that fit stay on the row's first line and the others go on
  indented ``name value`` lines under it (``stacked``), wrapped at the terminal's width.
- Control characters in stored text (a prompt may hold terminal escape sequences) are shown escaped
  (``\x1b``), so nothing a schedule holds can drive the terminal; a newline or tab is a space.
- Instants are shown in the schedule's own timezone (a row's ``timezone``; else the one given, which
  is ``PROMPTYOSELF_TIMEZONE``), to the second, with the offset and the zone's abbreviation:
  ``2026-11-24 09:00:00 +01:00 CET`` (a schedule's ``upcoming`` runs too).
- Everything else is ``key  value`` lines; nested objects (the worker lease, health's executor) are
  flattened to ``worker.pid``-style keys, so no JSON is printed on a terminal. A missing value is
  ``-`` and nothing prints Python's ``None``, ``True`` or ``False``.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from promptyoself import timing
from promptyoself.core.results import receipt_summary

ROW_COLUMNS: dict[str, tuple[str, ...]] = {
    "schedules": ("id", "agent_id", "target", "schedule_type", "schedule_value", "timezone", "state", "next_run",
                  "prompt_text"),
    "deliveries": ("schedule_id", "scheduled_for", "attempted_at", "outcome", "attempt", "lateness_s", "receipt",
                   "error"),
    "agents": ("id", "name", "created_at", "last_updated"),
    "executed": ("id", "agent_id", "outcome", "delivered", "next_run", "repetition_count", "error"),
    "policy_entries": ("name", "value", "source", "origin"),
}
"""The columns of each list a result may hold (the first list found is the table)."""

WRAPPED = frozenset({"prompt_text", "error"})
"""Columns whose text wraps to fit the terminal (each is the last of its table)."""
IDS = frozenset({"id", "agent_id", "schedule_id"})
"""Columns that always stay on a row's first line, whole, whatever the width."""
HEADS = {"schedule_type": "TYPE", "schedule_value": "RULE", "agent_id": "AGENT", "schedule_id": "SCHEDULE",
         "next_run": "NEXT RUN", "scheduled_for": "SCHEDULED FOR", "attempted_at": "ATTEMPTED AT",
         "lateness_s": "LATE", "repetition_count": "RUNS", "prompt_text": "PROMPT", "created_at": "CREATED",
         "last_updated": "UPDATED", "timezone": "ZONE"}
"""Column headers shorter than the field names (the JSON keeps the field names)."""
TIMES = frozenset({
    "next_run", "next_due", "last_run", "last_tick", "scheduled_for", "attempted_at", "created_at", "last_updated",
    "started_at", "heartbeat_at", "lease_until", "updated_at", "upcoming",
})
HIDDEN = frozenset({"next_run_local", "policy"})
"""Keys a terminal does not need: ``next_run_local`` repeats ``next_run``, which is already shown in
the schedule's timezone; ``policy`` repeats the rows of ``policy show``. (``status: success`` is left
out too; health's ``ok|degraded|down`` stays.)"""
MIN_WRAP = 30
INDENT = "    "
GAP = "  "


def terminal_width() -> int:
    return max(40, shutil.get_terminal_size((100, 24)).columns)


_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: str) -> str:
    """``text`` safe for a terminal: newlines and tabs become spaces; every other control character
    (ESC starts a terminal escape sequence), and the bidirectional and line-separator marks that
    reorder or break what a terminal shows, are written out escaped (``\\x1b``, ``\\u202e``)."""
    return _UNSAFE.sub(_escaped, text.replace("\r\n", " ").replace("\n", " ").replace("\t", " "))


def show_time(value: str, zone: ZoneInfo) -> str:
    """``2026-11-24T08:00:00.123456+00:00`` in Europe/Berlin -> ``2026-11-24 09:00:00 +01:00 CET``."""
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return value
    if when.tzinfo is None:
        return value
    try:
        local = when.astimezone(zone).replace(microsecond=0)
    except OverflowError:  # a row stored near the end of the calendar (issue 29 item 2): as stored
        return value
    offset = local.strftime("%z")
    name = local.tzname() or ""
    named = f" {name}" if name.isalpha() else ""  # 'CET', 'UTC'; not '+03', which repeats the offset
    return f"{local:%Y-%m-%d %H:%M:%S} {offset[:3]}:{offset[3:]}{named}"


def show(key: str, value: Any, zone: ZoneInfo, row: Mapping[str, Any] | None = None) -> str:
    """One value as a terminal shows it."""
    if value is None:
        return "-"
    if key == "receipt" and isinstance(value, Mapping):  # a history row's receipt (issue 43), in one line
        return clean(receipt_summary(value))
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}s" if key.endswith("_s") or key == "lateness_s" else f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(show(key, v, zone) for v in value) or "-"
    text = clean(str(value))
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
            return "\n".join([*lines, *footer(key, len(rows), rest, zone, width)])
    return "\n".join(key_values(result, zone, width))


def table(columns: tuple[str, ...], rows: list[Any], zone: ZoneInfo, width: int) -> list[str]:
    """Rows under a header, within ``width``. The ids and then every column that still fits stay
    side by side; the wrapped column (the last) takes what room is left. With less than ``MIN_WRAP``
    characters left it moves under its row instead, indented; columns that do not fit at all go on an
    indented ``name value`` line under their row, wrapped at the terminal's width."""
    cells = [[show(c, r.get(c), row_zone(r, zone), r) for c in columns] for r in rows]
    heads = [HEADS.get(c, c.upper()) for c in columns]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(heads)]
    last = len(columns) - 1
    wrapped = columns[last] in WRAPPED
    side: list[int] = []  # the columns shown side by side, in their order
    used = 0
    for i, c in enumerate(columns[: last if wrapped else last + 1]):
        need = widths[i] + (len(GAP) if side else 0)
        if c in IDS or (used + need <= width and len(side) == i):  # a column that does not fit ends the run
            side.append(i)
            used += need
    stacked = [i for i in range(last if wrapped else last + 1) if i not in side]
    below = False
    if wrapped:
        room = width - used - len(GAP)
        if room >= MIN_WRAP and not stacked:
            widths[last] = min(widths[last], room)
            side.append(last)
        else:
            below = True
    shown = [widths[i] for i in side]
    lines = [GAP.join(heads[i].ljust(w) for i, w in zip(side, shown, strict=True)).rstrip()]
    for row in cells:
        parts = [_wrap(row[i], widths[i]) if columns[i] in WRAPPED else [row[i]] for i in side]
        for n in range(max(len(p) for p in parts)):
            line = GAP.join((p[n] if n < len(p) else "").ljust(w) for p, w in zip(parts, shown, strict=True))
            lines.append(line.rstrip())
        if stacked:
            lines.extend(_packed([f"{heads[i].lower()}: {row[i]}" for i in stacked], width))
        if below and row[last] not in ("", "-"):
            lines.extend(_indented(row[last], width))
    return lines


def _packed(items: list[str], width: int) -> list[str]:
    """``name: value`` items on indented lines under a row: as many per line as fit, an item broken
    only when it is longer than a whole line."""
    lines: list[str] = []
    line = ""
    for item in items:
        if line and len(line) + len(GAP) + len(item) <= width:
            line += GAP + item
            continue
        if line:
            lines.append(line)
        line = INDENT + item
        if len(line) > width:
            *full, line = _indented(item, width)
            lines.extend(full)
    lines.append(line)
    return lines


def _indented(text: str, width: int) -> list[str]:
    """``text`` on lines under a row, indented, within ``width`` (only a word longer than a whole line
    is broken)."""
    return textwrap.wrap(text, max(MIN_WRAP, width), initial_indent=INDENT,
                         subsequent_indent=INDENT, break_on_hyphens=False) or [INDENT.rstrip()]


def _wrap(text: str, width: int) -> list[str]:
    """Words are never broken: an id inside an error stays whole (and may overhang its column)."""
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]


def footer(key: str, shown: int, rest: Mapping[str, Any], zone: ZoneInfo, width: int | None = None) -> list[str]:
    """What a list result says besides its rows: counts in words, the message, any other field."""
    out: list[str] = []
    total = rest.get("total")
    if isinstance(total, int) and total:
        who = f"agent {rest['agent_id']}" if rest.get("agent_id") else "all agents"
        out.append(f"{shown} of {total} {key} shown ({who}).")
    if rest.get("message"):
        out.append(clean(str(rest["message"])))
    if isinstance(rest.get("guardrails"), Mapping):
        out.extend(_wrap(guardrail_line(rest["guardrails"]), width or terminal_width()))
    others = {k: v for k, v in rest.items()
              if k not in {"count", "total", "agent_id", "message", "status", "guardrails", *HIDDEN}}
    out.extend(f"{k}: {show(k, v, zone)}" for k, v in flatten(others) if v is not None)
    return out


def guardrail_line(g: Mapping[str, Any]) -> str:
    """``list``/``history``'s guardrails in one line (docs/console.md): the agent's use, or the limits."""
    usage = g.get("usage")
    below = f"approval below {g['approval_below']}" if g.get("approval_below") else "approval off"
    if isinstance(usage, Mapping):
        budget = (f"{usage['delivered_today']} of {usage['daily_budget']} delivered today"
                  if usage.get("daily_budget") else f"{usage['delivered_today']} delivered today (no budget)")
        held = f", {usage['held_back']} held back over budget" if usage.get("held_back") else ""
        made = f"{usage['created_last_hour']}" + (f" of {usage['hourly_limit']}" if usage.get("hourly_limit") else "")
        return f"Guardrails: {budget}{held}; {made} schedules made in the last hour; {below}."
    budget = g.get("max_deliveries_per_agent_per_day") or "no"
    hourly = g.get("max_schedules_per_agent_per_hour") or "no limit of"
    return f"Guardrails: {budget} deliveries per agent a day; {hourly} schedules per agent an hour; {below}."


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
    lines = [clean(str(result["message"]))] if result.get("message") else []
    kept = {k: v for k, v in result.items() if k not in HIDDEN | {"message"} and (k, v) != ("status", "success")}
    pairs = list(flatten(kept))
    if not pairs:
        return lines
    # The key column is at most a third of the width: a longer key (guardrails.max_deliveries_...) stands
    # alone on its line with its value under it, so values keep room and a path or URL is never cut
    # mid-word at 80 columns. A word wider than the value column (a path) gets a line of its own.
    keys = min(max(len(k) for k, _ in pairs), max(12, width // 3))
    indent = " " * (keys + len(GAP))
    room = max(MIN_WRAP, width - len(indent))
    for k, v in pairs:
        text = show(k.rsplit(".", 1)[-1], v, zone, result)
        whole = k.rsplit(".", 1)[-1] in IDS  # an id is never broken
        chunks = textwrap.wrap(text, room, break_long_words=False, break_on_hyphens=False) or [text]
        out: list[str] = []
        for chunk in chunks:
            if len(chunk) <= room:
                out.append(indent + chunk)
            elif whole or len(chunk) <= width - 2:  # a long word: its own line from column 2, whole
                out.append("  " + chunk)
            else:  # wider than the terminal: cut only now
                out.extend("  " + part for part in textwrap.wrap(chunk, width - 2, break_on_hyphens=False))
        if len(k) > keys or not out[0].startswith(indent):
            lines.append(k)
        else:
            out[0] = k.ljust(keys) + GAP + out[0][len(indent):]
        lines.extend(line.rstrip() for line in out)
    return lines
