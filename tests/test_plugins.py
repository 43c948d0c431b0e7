"""Targets as plug-ins (issue 41 points 1-3): the one-file target of docs/plugins.md, installed as an
outside distribution (a ``*.dist-info`` with ``entry_points.txt`` on ``sys.path``, as pip leaves it),
is scheduled through MCP, REST and the CLI with its own options, refused on a bad option with nothing
stored, shown by ``targets`` and ``health``, and delivered once; a plug-in that does not load is
reported and refused by name, and nothing else is affected."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from fastmcp import Client

from promptyoself.core.operations import Core
from promptyoself.delivery.service import drain_once
from promptyoself.errors import InvalidArgument, NotSent
from promptyoself.faces.mcp import build_server
from promptyoself.faces.rest import build_rest_app
from promptyoself.store import schedules
from promptyoself.targets import registry
from promptyoself.targets.base import DeliveryTarget, Found, Occurrence, TargetPlugin
from tests.conftest import FIXED_NOW, make_settings

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "plugins.md"
AGENT = "agent-11111111-2222-3333-4444-555555555555"
TOKEN = "plugin-test-token"


def example_source() -> str:
    found = re.search(r"```python\n# promptyoself_jsonl.py\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert found is not None, "docs/plugins.md lost its example"
    return found.group(1)


def install(site: Path, *, module: str = "promptyoself_jsonl", value: str = "promptyoself_jsonl:plugin",
            name: str = "jsonl", source: str | None = None) -> Path:
    """An outside distribution in ``site``, as pip would leave it: the module and its dist-info."""
    site.mkdir(parents=True, exist_ok=True)
    if source is not None:
        (site / f"{module}.py").write_text(source, encoding="utf-8")
    info = site / f"{module.replace('_', '-')}-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[promptyoself.targets]\n{name} = {value}\n")
    return site


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """docs/plugins.md's target installed as a distribution of its own; its output file."""
    site = install(tmp_path / "site", source=example_source())
    out = tmp_path / "prompts.jsonl"
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("JSONL_TARGET_FILE", str(out))
    registry.reload()
    yield out
    sys.modules.pop("promptyoself_jsonl", None)
    monkeypatch.undo()
    registry.reload()


class Clock:
    def __init__(self) -> None:
        self.now = FIXED_NOW

    def __call__(self) -> Any:
        return self.now


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_our_entry_points_are_the_registrys_built_ins() -> None:
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    declared = groups[registry.GROUP]
    assert declared == registry.BUILT_IN
    for name in declared:
        plugin = registry.plugin(name)
        assert isinstance(plugin, TargetPlugin) and plugin.name == name
    assert groups[registry.STDIO_GROUP] == registry.BUILT_IN_STDIO
    assert set(registry.BUILT_IN_STDIO) <= set(registry.BUILT_IN)  # each one an agent CLI's target
    assert len(registry.stdio_hooks()) == len(registry.BUILT_IN_STDIO)
    assert groups[registry.SECRETS_GROUP] == registry.BUILT_IN_SECRETS
    assert set(registry.BUILT_IN_SECRETS) <= set(registry.BUILT_IN)


@pytest.mark.slow
def test_the_targets_secrets_are_read_without_loading_a_plug_in(tmp_path: Path) -> None:
    """The log filter asks ``registry.secrets`` with a process's first line: the webhook endpoints'
    secrets come from its declared source (a settings module), and no plug-in is imported for it."""
    code = (
        "import sys\n"
        "from promptyoself.targets import registry\n"
        "found = registry.secrets()\n"
        "plugins = sorted(m for m in sys.modules if m.startswith('promptyoself.targets.')\n"
        "                 and m.rpartition('.')[2] in ('plugin', 'base'))\n"
        "print('whsec_c2VjcmV0c2VjcmV0c2VjcmV0' in found, plugins)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PROMPTYOSELF_ENV_FILE": str(tmp_path / "none.env"),
           "PROMPTYOSELF_WEBHOOK_URL": "https://hooks.example.com/in",
           "PROMPTYOSELF_WEBHOOK_SECRET": "whsec_c2VjcmV0c2VjcmV0c2VjcmV0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "True []", out.stderr[-2000:]


def test_a_stdio_hook_that_does_not_apply_leaves_the_plain_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLAUDE_PLUGIN_ROOT", raising=False)  # not started as a Claude Code plugin
    for hook in registry.stdio_hooks():
        assert hook(object()) is False  # decided without touching the server


def test_the_example_is_a_working_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JSONL_TARGET_FILE", str(tmp_path / "out.jsonl"))
    module: dict[str, Any] = {}
    exec(compile(example_source(), "promptyoself_jsonl", "exec"), module)
    plugin = module["plugin"]
    assert isinstance(plugin, TargetPlugin)
    target = plugin.create(make_settings(tmp_path / "p.db"))
    occ = Occurrence(schedule_id=1, occurrence_id="o-1", agent_id=AGENT, text="hi", prompt="hi", due=FIXED_NOW,
                     options={"tag": "ops"})

    async def scenario() -> tuple[Found, Found]:
        with pytest.raises(NotSent):
            await target.send(occ, lambda: False)
        before = await target.lookup(occ)
        await target.send(occ, lambda: True)
        await target.probe()
        return before, await target.lookup(occ)

    assert asyncio.run(scenario()) == (Found("absent"), Found("found"))
    assert isinstance(target, DeliveryTarget) and "JSON lines at" in target.readiness()
    assert [x["tag"] for x in lines(tmp_path / "out.jsonl")] == ["ops"]


async def test_an_outside_target_through_mcp_rest_and_delivery(outside: Path, tmp_path: Path) -> None:
    assert "jsonl" in registry.names()
    clock = Clock()
    core = Core(make_settings(tmp_path / "p.db", http_token=TOKEN), clock=clock)
    try:
        async with Client(build_server(core)) as client:
            tools = {t.name: t for t in await client.list_tools()}
            target_schema = tools["promptyoself_schedule_time"].input_schema["properties"]["target"]
            assert "jsonl" in json.dumps(target_schema)  # the tool's schema lists the installed targets
            made = await client.call_tool("promptyoself_schedule_time", {
                "prompt": "check the queue", "time": "in 5m", "agent_id": AGENT, "target": "jsonl",
                "target_options": {"tag": "ops"}}, raise_on_error=False)
            body = json.loads(made.content[0].text)
            assert body["status"] == "success", body
            assert (body["target"], body["target_options"]) == ("jsonl", {"tag": "ops"})
            for bad, field in (({"colour": "red"}, "colour"), ({"tag": "NOT A TAG"}, "tag")):
                refused = await client.call_tool("promptyoself_schedule_time", {
                    "prompt": "x", "time": "in 5m", "agent_id": AGENT, "target": "jsonl", "target_options": bad},
                    raise_on_error=False)
                error = json.loads(refused.content[0].text)
                assert error["code"] == "invalid_argument" and f"target_options.{field}" in error["error"], error
            listed = json.loads((await client.call_tool("promptyoself_targets", {})).content[0].text)
            jsonl = next(t for t in listed["targets"] if t["name"] == "jsonl")
            assert jsonl["ready"] and jsonl["options"] == {"tag": "a word written with each line"}
        with TestClient(build_rest_app(core), headers={"Authorization": f"Bearer {TOKEN}"}) as rest:
            ok = rest.post("/api/schedules/time", json={"prompt": "from rest", "time": "in 6m", "agent_id": AGENT,
                                                        "target": "jsonl", "target_options": {"tag": "rest"}})
            assert ok.status_code == 200, ok.text
            bad = rest.post("/api/schedules/time", json={"prompt": "x", "time": "in 6m", "agent_id": AGENT,
                                                         "target": "jsonl", "target_options": {"colour": "red"}})
            assert bad.status_code == 400 and "target_options.colour" in bad.json()["error"]
            assert [t["name"] for t in rest.get("/api/targets").json()["targets"]] == list(registry.names())
        assert schedules.count_live(core.store, AGENT) == 2  # the refused ones stored nothing
        assert (await core.health())["targets"]["jsonl"] == {"active": 2, "due": 0}
        clock.now = FIXED_NOW + timedelta(minutes=10)
        drain_once(core)
        drain_once(core)  # nothing left: each occurrence once
        assert sorted((x["tag"], x["agent"]) for x in lines(outside)) == [("ops", AGENT), ("rest", AGENT)]
        readiness = (await core.health())["readiness"]
        assert readiness.get("jsonl", "").startswith("JSON lines at") or "jsonl" not in readiness
    finally:
        core.close()


def test_a_plugin_that_does_not_load_is_reported_and_refused(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    site = install(tmp_path / "site", module="broken_target", value="broken_target:plugin", name="broken",
                   source="raise RuntimeError('this plug-in needs a library that is not installed')\n")
    monkeypatch.syspath_prepend(str(site))
    registry.reload()
    core = Core(make_settings(tmp_path / "p.db"), clock=lambda: FIXED_NOW)
    try:
        assert "broken" in registry.names()
        with pytest.raises(InvalidArgument, match="failed to load: RuntimeError: this plug-in needs"):
            asyncio.run(core.scheduling.schedule_time("x", "in 5m", agent_id=AGENT, target="broken"))
        report = asyncio.run(core.targets())
        broken = next(t for t in report["targets"] if t["name"] == "broken")
        assert not broken["ready"] and "RuntimeError" in (broken["error"] or "")
        assert [r for r in asyncio.run(core.health())["reasons"] if r["code"] == "target_plugin_broken"]
        assert asyncio.run(core.scheduling.schedule_time("still works", "in 5m", agent_id=AGENT,
                                                         skip_validation=True))["status"] == "success"
    finally:
        core.close()
        sys.modules.pop("broken_target", None)
        monkeypatch.undo()
        registry.reload()


@pytest.mark.slow
def test_the_cli_schedules_an_outside_target_and_delivers_it_once(tmp_path: Path) -> None:
    site = install(tmp_path / "site", source=example_source())
    out = tmp_path / "prompts.jsonl"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PROMPTYOSELF_", "LETTA_"))},
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "JSONL_TARGET_FILE": str(out),
           "PROMPTYOSELF_DB": str(tmp_path / "p.db"), "PROMPTYOSELF_EXECUTOR_MODE": "off",
           "PROMPTYOSELF_ENV_FILE": str(tmp_path / "none.env"), "HOME": str(tmp_path)}

    def cli(*args: str) -> tuple[int, dict[str, Any]]:
        proc = subprocess.run([sys.executable, "-m", "promptyoself", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {"stderr": proc.stderr}

    rc, listed = cli("targets")
    assert rc == 0 and "jsonl" in [t["name"] for t in listed["targets"]], listed
    rc, bad = cli("schedule", "--prompt", "x", "--time", "in 1m", "--agent-id", AGENT, "--target", "jsonl",
                  "--target-option", "colour=red")
    assert rc == 1 and "target_options.colour" in bad["error"]
    rc, made = cli("schedule", "--prompt", "from the cli", "--time", "2020-01-01T00:00:00Z", "--agent-id", AGENT,
                   "--target", "jsonl", "--target-option", "tag=cli")
    assert rc == 1 and made["code"] == "time_in_past"  # a past time is refused; a due one is made below
    rc, made = cli("schedule", "--prompt", "from the cli", "--every", "1h", "--start-at", "in 1s",
                   "--max-repetitions", "1", "--agent-id", AGENT, "--target", "jsonl", "--target-option", "tag=cli")
    assert rc == 0 and made["target_options"] == {"tag": "cli"}, made
    rc, listing = cli("list", "--agent-id", AGENT)
    assert rc == 0 and listing["total"] == 1
    for _ in range(60):  # until its first run is due (a second from now)
        cli("execute")
        if lines(out):
            break
    assert [(x["tag"], x["text"].endswith("from the cli")) for x in lines(out)] == [("cli", True)]
    cli("execute")
    assert len(lines(out)) == 1


def test_the_clis_description_names_what_it_schedules_for() -> None:
    """Issue 45 point 3: not "for Letta agents" only; the installed targets are one command away."""
    from promptyoself.faces.cli import build_parser

    text = build_parser().format_help()
    assert "Schedule prompts for AI agents" in text and "promptyoself targets" in text
    assert "targets" in text.split("Available commands:")[1]
