"""The geometry of the console's two timeline charts (faces/templates/console/timeline.html draws
it as inline SVG: no JavaScript, nothing fetched). Input: ``core.timeline``'s plain data; output:
plain numbers and labels, so the template only places them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from promptyoself.core.timeline import OUTCOMES, Recent, Upcoming

WIDTH = 1100
LEFT = 240
RIGHT = 12
ROW = 26
AXIS = 30
BARS_HEIGHT = 180
COLORS = {"delivered": "#1f7a3d", "retry": "#d89a00", "failed": "#b3261e", "missed": "#e06c00",
          "over_budget": "#7b3fb0", "skipped": "#9a6b3f", "queued": "#3f7f9a", "sent_lost_claim": "#6b7280"}


def _x(at: datetime, start: datetime, end: datetime) -> float:
    span = (end - start).total_seconds() or 1.0
    return round(LEFT + (at - start).total_seconds() / span * (WIDTH - LEFT - RIGHT), 1)


def runs_chart(data: Upcoming, tz: ZoneInfo) -> dict[str, Any]:
    start, end = data["start"], data["end"]
    days = []
    first = start.astimezone(tz).date()
    for i in range(1, 10):
        day = first + timedelta(days=i)
        at = datetime(day.year, day.month, day.day, tzinfo=tz)  # midnight, wall clock in tz
        if start < at < end:
            days.append({"x": _x(at, start, end), "label": at.strftime("%a %d %b")})
    rows = []
    for i, agent in enumerate(data["agents"]):
        y = AXIS + i * ROW
        marks = [{"x": _x(r["at"], start, end), "at": r["at"], "schedule_id": r["schedule_id"]} for r in agent["runs"]]
        bands = [{"x": _x(b["start"], start, end), "start": b["start"], "schedule_id": b["schedule_id"]}
                 for b in agent["bands"]]
        rows.append({"agent_id": agent["agent_id"], "y": y, "marks": marks, "bands": bands,
                     "hidden": agent["hidden_runs"], "schedules": agent["schedules"],
                     "count": len(marks) + agent["hidden_runs"]})
    height = AXIS + max(len(rows), 1) * ROW + 8
    return {"width": WIDTH, "height": height, "left": LEFT, "right": WIDTH - RIGHT, "axis": AXIS, "row": ROW,
            "days": days, "rows": rows, "start": start, "end": end, "hidden_agents": data["hidden_agents"],
            "truncated": data["truncated"]}


def bars_chart(data: Recent, tz: ZoneInfo) -> dict[str, Any]:
    hours = data["hours"]
    slot = (WIDTH - LEFT - RIGHT) / max(len(hours), 1)
    peak = max((sum(h["counts"].values()) for h in hours), default=0) or 1
    bars = []
    for i, hour in enumerate(hours):
        x = round(LEFT + i * slot + 2, 1)
        y: float = AXIS + BARS_HEIGHT
        segments = []
        for outcome in [*OUTCOMES, *sorted(set(hour["counts"]) - set(OUTCOMES))]:
            n = hour["counts"].get(outcome, 0)
            if not n:
                continue
            h = round(n / peak * BARS_HEIGHT, 1)
            y = round(y - h, 1)
            segments.append({"outcome": outcome, "n": n, "y": y, "h": h, "color": COLORS.get(outcome, "#444")})
        local = hour["start"].astimezone(tz)
        bars.append({"x": x, "w": round(slot - 4, 1), "segments": segments, "start": hour["start"],
                     "label": local.strftime("%H:00") if i % 3 == 0 else "", "total": sum(hour["counts"].values())})
    legend = [{"outcome": o, "color": COLORS[o], "n": data["total"].get(o, 0)} for o in OUTCOMES]
    return {"width": WIDTH, "height": AXIS + BARS_HEIGHT + 28, "left": LEFT, "right": WIDTH - RIGHT, "axis": AXIS,
            "base": AXIS + BARS_HEIGHT, "peak": peak, "bars": bars, "legend": legend, "truncated": data["truncated"],
            "start": data["start"], "end": data["end"]}
