"""How the command line shows a result on a terminal (``promptyoself.faces.cli`` prints JSON otherwise).

The layout is `rich <https://rich.readthedocs.io>`_'s (``rich.table.Table``), printed without colour
or borders to a string at the terminal's width; this module only chooses what goes where:

- Lists (schedules, deliveries, agents, executed prompts) are a table when their columns fit the
  terminal side by side: every column whole on one line, the last one (a prompt, an error) wrapped in
  the room left, at least ``MIN_WRAP`` characters. When they do not fit, each row is shown as a
  block of ``name  value`` lines, one block per row, a blank line between them (as ``psql``'s
  expanded display). Either way ids are never cut (an agent id is 42 characters and two agents
  differ at its end) and long text is wrapped onto more lines, never cut.
- Control characters in stored text (a prompt may hold terminal escape sequences) are shown escaped
  (``\\x1b``), so nothing a schedule holds can drive the terminal; a newline or tab is a space. Text
  reaches rich as ``rich.text.Text``, never as markup, so a ``[red]`` in a prompt is shown as typed.
- Instants are shown in the schedule's own timezone (a row's ``timezone``; else the one given, which
  is ``PROMPTYOSELF_TIMEZONE``), to the second, with the offset and the zone's abbreviation:
  ``2026-11-24 09:00:00 +01:00 CET`` (a schedule's ``upcoming`` runs too).
- Everything else is ``key  value`` lines; nested objects (the worker lease, health's executor) are
  flattened to ``worker.pid``-style keys, so no JSON is printed on a terminal. A missing value is
  ``-`` and nothing prints Python's ``None``, ``True`` or ``False``.

rich is imported when a result is drawn, not with this module: ``schedule`` and ``list`` piped to
an agent print JSON and load no more than they use (tests/test_cli_imports.py).
"""

from __future__ import annotations

import io
import re
import shutil
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from promptyoself import timing
from promptyoself.core.results import receipt_summary

if TYPE_CHECKING:
    from rich.console import RenderableType

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
"""Values never broken, whatever the width."""
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
"""The least room a wrapped column (a prompt, an error) gets beside the others in a table."""
GAP = 2
"""Spaces between two columns."""


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
            shown = table(columns, rows, zone, width) if rows else [] if key == "executed" else [f"No {key}{of}."]
            rest = {k: v for k, v in result.items() if k != key}
            return "\n".join([*shown, *footer(key, len(rows), rest, zone, width)])
    return "\n".join(key_values(result, zone, width))


def _lines(parts: list[RenderableType], width: int) -> list[str]:
    """What rich draws of ``parts`` at ``width`` columns: plain text (no colour, no markup, no
    emoji codes), trailing spaces dropped."""
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, force_terminal=False, force_jupyter=False,
                      markup=False, emoji=False, highlight=False, soft_wrap=False, legacy_windows=False)
    for part in parts:
        console.print(part, crop=False)
    return [line.rstrip() for line in out.getvalue().splitlines()]


def table(columns: tuple[str, ...], rows: list[Any], zone: ZoneInfo, width: int) -> list[str]:
    """Rows under a header when every column fits beside the others within ``width`` (the wrapped
    last column with at least ``MIN_WRAP`` characters, or all it needs); else one block of
    ``name  value`` lines per row (``cards``)."""
    from rich.cells import cell_len
    from rich.table import Column, Table
    from rich.text import Text

    cells = [[show(c, r.get(c), row_zone(r, zone), r) for c in columns] for r in rows]
    heads = [HEADS.get(c, c.upper()) for c in columns]
    widths = [max([cell_len(h)] + [cell_len(row[i]) for row in cells]) for i, h in enumerate(heads)]
    if columns[-1] in WRAPPED:
        widths[-1] = min(widths[-1], MIN_WRAP)
    if sum(widths) + GAP * (len(columns) - 1) > width:
        return cards(columns, cells, width)
    grid = Table(*(Column(h, no_wrap=c not in WRAPPED, overflow="fold") for c, h in zip(columns, heads, strict=True)),
                 box=None, padding=(0, GAP, 0, 0), pad_edge=False, show_edge=False, header_style="none")
    for row in cells:
        grid.add_row(*(Text(cell) for cell in row))
    return _lines([grid], width)


def cards(columns: tuple[str, ...], cells: list[list[str]], width: int) -> list[str]:
    """Each row as its own ``name  value`` lines (the header in lower case as the name), a blank
    line between rows."""
    names = [HEADS.get(c, c).lower() for c in columns]
    lines: list[str] = []
    for n, row in enumerate(cells):
        if n:
            lines.append("")
        lines.extend(_pairs([(name, value, c in IDS) for c, name, value in zip(columns, names, row, strict=True)],
                            width))
    return lines


def _pairs(pairs: list[tuple[str, str, bool]], width: int) -> list[str]:
    """``(key, value, whole)`` as ``key  value`` lines, the values wrapped in a column of their own.
    The key column is at most a third of the width: a longer key stands alone on its line with its
    value under it, so values keep room and a path or URL is never cut mid-word at 80 columns. A
    value with a word wider than the value column (a path) is shown on its own lines from column 2;
    ``whole`` values (ids) are never broken, other words only when wider than the terminal."""
    from rich.cells import cell_len
    from rich.padding import Padding
    from rich.table import Column, Table
    from rich.text import Text

    if not pairs:
        return []
    keys = min(max(cell_len(k) for k, _, _ in pairs), max(12, width // 3))
    room = max(MIN_WRAP, width - keys - GAP)
    parts: list[RenderableType] = []
    for key, value, whole in pairs:
        longest = max((cell_len(word) for word in value.split()), default=0)
        if cell_len(key) <= keys and longest <= room:
            row = Table.grid(Column(width=keys, no_wrap=True), Column(overflow="fold"), padding=(0, GAP, 0, 0))
            row.add_row(Text(key), Text(value))
            parts.append(row)
            continue
        parts.append(Text(key, no_wrap=True, overflow="ignore"))
        if longest <= room:  # a long key, an ordinary value: the value where the values are
            parts.append(Padding(Text(value, overflow="fold"), (0, 0, 0, keys + GAP)))
        else:
            parts.append(Padding(Text(value, no_wrap=whole, overflow="ignore" if whole else "fold"), (0, 0, 0, 2)))
    return _lines(parts, width)


def footer(key: str, shown: int, rest: Mapping[str, Any], zone: ZoneInfo, width: int | None = None) -> list[str]:
    """What a list result says besides its rows: counts in words, the message, any other field."""
    from rich.text import Text

    out: list[str] = []
    total = rest.get("total")
    if isinstance(total, int) and total:
        who = f"agent {rest['agent_id']}" if rest.get("agent_id") else "all agents"
        out.append(f"{shown} of {total} {key} shown ({who}).")
    if rest.get("message"):
        out.append(clean(str(rest["message"])))
    if isinstance(rest.get("guardrails"), Mapping):
        out.append(guardrail_line(rest["guardrails"]))
    others = {k: v for k, v in rest.items()
              if k not in {"count", "total", "agent_id", "message", "status", "guardrails", *HIDDEN}}
    out.extend(f"{k}: {show(k, v, zone)}" for k, v in flatten(others) if v is not None)
    return _lines([Text(line, overflow="fold") for line in out], width or terminal_width())


def guardrail_line(g: Mapping[str, Any]) -> str:
    """``list``/``history``'s guardrails in one line (docs/console.md): the agent's use, or the limits."""
    usage = g.get("usage")
    below = f"approval below {g['approval_below']}" if g.get("approval_below") else "approval off"
    if isinstance(usage, Mapping):
        budget = (f"{usage['delivered_today']} of {usage['daily_budget']} delivered today"
                  if usage.get("daily_budget") else f"{usage['delivered_today']} delivered today (no budget)")
        held = f", {usage['held_back']} held back over budget" if usage.get("held_back") else ""
        made = f"{usage['created_last_hour']}" + (f" of {usage['hourly_limit']}" if usage.get("hourly_limit") else "")
        return f"Guardrails: {budget}{held}{_spent(usage)}; {made} schedules made in the last hour; {below}."
    budget = g.get("max_deliveries_per_agent_per_day") or "no"
    hourly = g.get("max_schedules_per_agent_per_hour") or "no limit of"
    cost = "".join(f"; {g[k]:g} {what} per agent a day" for k, what in (
        ("max_tokens_per_agent_per_day", "tokens"), ("max_cost_usd_per_agent_per_day", "USD"))
        if isinstance(g.get(k), int | float) and g[k])
    return f"Guardrails: {budget} deliveries per agent a day{cost}; {hourly} schedules per agent an hour; {below}."


def _spent(usage: Mapping[str, Any]) -> str:
    """The cost budgets' part of the guardrail line: shown once a budget is set or something was spent."""
    out = ""
    for used, cap, what in (("tokens_today", "token_budget", "tokens"), ("cost_usd_today", "cost_budget_usd", "USD")):
        value, limit = usage.get(used), usage.get(cap)
        if isinstance(limit, int | float) and limit:
            out += f", {value or 0:g} of {limit:g} {what} today"
        elif isinstance(value, int | float) and value:
            out += f", {value:g} {what} today"
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
    from rich.text import Text

    zone = row_zone(result, zone)
    message = _lines([Text(clean(str(result["message"])))], width) if result.get("message") else []
    kept = {k: v for k, v in result.items() if k not in HIDDEN | {"message"} and (k, v) != ("status", "success")}
    pairs = [(k, show(k.rsplit(".", 1)[-1], v, zone, result), k.rsplit(".", 1)[-1] in IDS) for k, v in flatten(kept)]
    return [*message, *_pairs(pairs, width)]
