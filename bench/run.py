"""The one benchmark entry point: ``python -m bench`` (or ``python bench/run.py``).

Runs each section, prints a table and writes docs/performance.md with every figure, the command
that produced it, the target and whether it was met. A section is a module under bench/ with

    TITLE = "..."                         # heading on the page
    def add_arguments(parser) -> None     # optional: its own --options
    def run(args) -> list[bench.common.Row]

Raise ``bench.common.NotRun("reason")`` from ``run`` when it cannot run here. A registered section
whose module does not exist yet is reported as "not run" with the reason; nothing is invented.
To add a section, write the module and add one line to ``SECTIONS``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

if __package__ in (None, ""):  # run as a file: python bench/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, NotRun, Row, say


@dataclass(frozen=True)
class Section:
    name: str
    module: str
    item: str  # acceptance item(s) of issue 4
    title: str
    pending: str = ""  # why it may not exist yet


SECTIONS: tuple[Section, ...] = (
    Section("startup", "bench.startup", "2a, 2b", "Start-up and peak RSS against a one-tool FastMCP server"),
    Section("latency", "bench.latency", "2c", "Tool latency over stdio by database size"),
    Section("lateness", "bench.lateness", "2d", "Delivery lateness p50/p99, SQLite and PostgreSQL"),
    Section("burst", "bench.burst", "2e", "Burst: 10,000 prompts due at once to 1,000 agents"),
    Section("idle", "bench.idle_cpu", "2f", "Idle CPU of server + worker with 10,000 future schedules"),
    Section("stdio_relay", "bench.stdio_relay", "13.1", "Stdio start through the service's relay vs in-process"),
    Section("cli_speed", "bench.cli_speed", "32.3", "An agent's CLI call beside a bare Python start"),
    Section("scaleout", "bench.scaleout", "13.2", "Scale-out: 4 shared workers on PostgreSQL, 10,000 prompts"),
    Section("million", "bench.million", "13.3", "A million schedules: latency and idle CPU, SQLite and PostgreSQL"),
    Section("peer", "bench.peer", "20.5", "PromptYoSelf beside procrastinate and pgqueuer: 10,000 POSTs on PostgreSQL"),
    Section("starts", "bench.starts", "28", "Every start delivers: first-prompt lateness by client pattern; exits"),
    Section("timelang", "bench.timelang", "29.1", "Time language: CPU per rule, phrase and interval (adversarial)"),
    Section("capacity", "bench.capacity", "42.15", "Capacity: 10,000 every-minute schedules, 200 agents, one worker"),
)

KEEP_MARKER = "<!-- bench/run.py keeps everything below this line when it rewrites the page -->"


@dataclass
class Outcome:
    section: Section
    rows: list[Row]
    status: str  # ran | not run | failed
    reason: str = ""
    seconds: float = 0.0


def load_section(section: Section) -> ModuleType | str:
    """The section's module, or the reason it cannot be loaded."""
    try:
        return importlib.import_module(section.module)
    except ModuleNotFoundError as exc:
        if exc.name == section.module:
            path = section.module.replace(".", "/") + ".py"
            why = f"{path} does not exist yet"
            return f"{why}: {section.pending}" if section.pending else why
        return f"cannot import {section.module}: {exc}"


def build_parser(modules: dict[str, ModuleType]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes and few runs: a smoke test, not figures")
    p.add_argument("--only", default=None,
                   help="comma-separated sections to run: " + ", ".join(s.name for s in SECTIONS))
    p.add_argument("--out", default=str(ROOT / "docs" / "performance.md"),
                   help="page to write (default docs/performance.md); '-' writes nothing")
    p.add_argument("--pg-url", default=os.environ.get("PROMPTYOSELF_TEST_PG_URL"),
                   help="PostgreSQL URL for sections that use it (default $PROMPTYOSELF_TEST_PG_URL)")
    for module in modules.values():
        add = getattr(module, "add_arguments", None)
        if add is not None:
            add(p)
    return p


def run_sections(args: Any, modules: dict[str, ModuleType | str], selected: list[Section]) -> list[Outcome]:
    from promptyoself.faces.progress import section_bar

    with section_bar(len(selected)) as step:  # on stderr, only when it is a terminal
        return _run_sections(args, modules, selected, step)


def _run_sections(args: Any, modules: dict[str, ModuleType | str], selected: list[Section],
                  step: Callable[[int, str], None]) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for section in selected:
        step(len(outcomes), f"bench: {section.name}")
        module = modules[section.name]
        if isinstance(module, str):
            outcomes.append(Outcome(section, [], "not run", module))
            say(f"[bench] {section.name}: not run ({module})")
            continue
        say(f"[bench] {section.name}: running ...")
        t0 = time.perf_counter()
        try:
            rows = list(module.run(args))
            outcome = Outcome(section, rows, "ran")
        except NotRun as exc:
            outcome = Outcome(section, [], "not run", str(exc))
        except Exception as exc:
            traceback.print_exc()
            outcome = Outcome(section, [], "failed", f"{type(exc).__name__}: {exc}")
        outcome.seconds = time.perf_counter() - t0
        say(f"[bench] {section.name}: {outcome.status} in {outcome.seconds:.1f} s")
        outcomes.append(outcome)
        step(len(outcomes), f"bench: {section.name}")
    return outcomes


def text_table(outcomes: list[Outcome]) -> str:
    header = ("section", "figure", "value", "target", "result")
    lines: list[tuple[str, ...]] = [header]
    for o in outcomes:
        if o.status != "ran":
            lines.append((o.section.name, o.status.upper(), "", "", o.reason))
            continue
        for r in o.rows:
            lines.append((o.section.name, r.metric, r.shown(), r.target, r.verdict))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    widths[-1] = min(widths[-1], 80)
    out = []
    for n, line in enumerate(lines):
        out.append("  ".join(cell.ljust(w) if i < len(line) - 1 else cell
                             for i, (cell, w) in enumerate(zip(line, widths, strict=True))).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{rev}{' + uncommitted changes' if dirty else ''}" if rev else "unknown"


def _md(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def record(o: Outcome, args: Any, argv: list[str]) -> dict[str, Any]:
    """What the page needs of one section's run, kept in the JSON beside the page."""
    return {
        "status": o.status,
        "reason": o.reason,
        "seconds": round(o.seconds, 1),
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "invocation": " ".join(["python -m bench", *argv]).strip(),
        "quick": bool(args.quick),
        "code": _git_rev(),
        "rows": [asdict(r) for r in o.rows],
    }


def load_records(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data.get("sections", {}) if isinstance(data, dict) else {}


def before_after(records: dict[str, Any], before_path: Path) -> list[str]:
    """A table of the figures recorded in ``before_path`` (an earlier run's JSON) next to today's."""
    try:
        before = json.loads(before_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    lines = ["", "## Before and after", "", str(before.get("note", "")), "",
             "| section | figure | before | now | change |", "|---|---|---|---|---|"]
    shown, sources = 0, []
    for name, old in (before.get("sections") or {}).items():
        new = records.get(name)
        if not new or new.get("status") != "ran" or new.get("quick"):
            continue
        now = {r["metric"]: Row(**r) for r in new["rows"]}
        for r in old.get("rows", []):
            a, b = Row(**r), now.get(r["metric"])
            if b is None or a.value is None or b.value is None:
                continue
            if a.value > 0 and b.value > 0:
                change = f"{b.value / a.value:.2f}×"
            else:
                change = f"{b.value - a.value:+.1f} {b.unit}".strip()
            lines.append(f"| {name} | {_md(a.metric)} | {a.shown()} | {b.shown()} | {change} |")
            shown += 1
        sources.append(f"- {name}, before: `{old.get('invocation', '')}` at {old.get('generated', '?')} "
                       f"(git {old.get('code', '?')})")
    return [*lines, "", *sources] if shown else []


def markdown(records: dict[str, Any], modules: dict[str, ModuleType | str], before: Path | None = None) -> str:
    import fastmcp

    lines = [
        "# Performance",
        "",
        "Every figure on this page was printed by `python -m bench` (bench/run.py) and copied here by it;",
        "none is written by hand. Each section names the command that reproduces it and when it last ran.",
        "`python -m bench --only SECTION` re-runs one section and keeps the others' last figures",
        "(they live in docs/performance.json).",
        "",
        f"- Machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"FastMCP {fastmcp.__version__}",
        "",
        "## Summary",
        "",
        "| item | section | status | targets |",
        "|---|---|---|---|",
    ]
    for s in SECTIONS:
        rec = records.get(s.name) or _never_run(s, modules)
        rows = [Row(**r) for r in rec["rows"]]
        targets = [r for r in rows if r.met is not None]
        if rec["status"] != "ran":
            verdict = rec["reason"]
        elif not targets:
            verdict = "no target"
        else:
            missed = [r for r in targets if not r.met]
            verdict = "all met" if not missed else "MISSED: " + "; ".join(
                f"{r.metric} = {r.shown()} (target {r.target})" for r in missed)
        quick = " (--quick smoke figures)" if rec.get("quick") else ""
        lines.append(f"| {s.item} | {s.name}: {s.title} | {rec['status']}{quick} | {_md(verdict)} |")
    if before is not None:
        lines += before_after(records, before)
    for s in SECTIONS:
        rec = records.get(s.name) or _never_run(s, modules)
        module = modules.get(s.name)
        title = getattr(module, "TITLE", s.title) if not isinstance(module, str) else s.title
        lines += ["", f"## {s.item} — {title}", ""]
        if rec["status"] != "ran":
            lines.append(f"**{rec['status']}**: {_md(rec['reason'])}")
            continue
        doc = (module.__doc__ or "").strip() if isinstance(module, ModuleType) else ""
        if doc:
            lines += [" ".join(doc.split("\n\n", 1)[-1].split()), ""]
        quick = " **--quick: smoke sizes, not real figures.**" if rec.get("quick") else ""
        lines.append(f"Last run {rec['generated']} (git {rec['code']}) by `{rec['invocation']}`, "
                     f"{rec['seconds']:.0f} s.{quick}")
        lines += ["", "| figure | value | target | result | note |", "|---|---|---|---|---|"]
        rows = [Row(**r) for r in rec["rows"]]
        for r in rows:
            verdict = {None: "", True: "met", False: "**missed**"}[r.met]
            lines.append(f"| {_md(r.metric)} | {r.shown()} | {_md(r.target)} | {verdict} | {_md(r.note)} |")
        commands = sorted({r.command for r in rows if r.command})
        if commands:
            lines += ["", "Command:", ""] + [f"    {c}" for c in commands]
        explain = getattr(module, "explain", None)
        if callable(explain):
            text = explain(rows)
            if text:
                lines += ["", text]
    return "\n".join(lines) + "\n"


def _never_run(s: Section, modules: dict[str, ModuleType | str]) -> dict[str, Any]:
    module = modules.get(s.name)
    reason = module if isinstance(module, str) else "not run yet: python -m bench --only " + s.name
    return {"status": "not run", "reason": reason, "rows": []}


def write_page(path: Path, records: dict[str, Any], modules: dict[str, ModuleType | str]) -> None:
    """Write the JSON beside the page and the page itself, keeping notes below KEEP_MARKER."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps({"sections": records}, indent=1) + "\n", encoding="utf-8")
    kept = ""
    if path.exists():
        old = path.read_text(encoding="utf-8")
        if KEEP_MARKER in old:
            kept = old.split(KEEP_MARKER, 1)[1]
    before = path.with_name(path.stem + "-before.json")
    page = markdown(records, modules, before if before.exists() else None)
    path.write_text(page + "\n" + KEEP_MARKER + (kept or "\n"), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    modules: dict[str, ModuleType | str] = {s.name: load_section(s) for s in SECTIONS}
    parser = build_parser({k: m for k, m in modules.items() if not isinstance(m, str)})
    args = parser.parse_args(argv)
    wanted = [s.strip() for s in args.only.split(",")] if args.only else [s.name for s in SECTIONS]
    unknown = sorted(set(wanted) - {s.name for s in SECTIONS})
    if unknown:
        parser.error(f"unknown section(s): {', '.join(unknown)}")
    selected = [s for s in SECTIONS if s.name in wanted]
    outcomes = run_sections(args, modules, selected)
    sys.stdout.write(text_table(outcomes) + "\n")
    if args.out != "-":
        out = Path(args.out)
        records = load_records(out.with_suffix(".json"))
        for o in outcomes:
            records[o.section.name] = record(o, args, argv)
        for s in SECTIONS:  # a section that cannot load now must not keep stale figures
            if isinstance(modules[s.name], str):
                records.pop(s.name, None)
        write_page(out, records, modules)
        say(f"\nwrote {out} and {out.with_suffix('.json').name}")
    return 1 if any(o.status == "failed" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
