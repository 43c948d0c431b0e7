"""Acceptance with the real Letta Code 0.34.12 (``../shared/letta-code``, its own instance and ports):
from an empty database with nothing else running, agents schedule through their Bash tool (the mock
LLM calls it) with our CLI, and the prompts arrive in their conversations once, on time, with no
other client connected; a recurring prompt keeps arriving once per slot across a Letta Code
restart; two agents never see each other's prompts. Skipped (saying so) only when the harness
folder is absent; ``.ci/run`` installs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from promptyoself.store.db import Delivery, Schedule
from promptyoself.targets.letta_code.client import LettaCodeClient
from tests.helpers_delivery import child_env, kill_all, make_core, wait_until
from tests.letta_code_harness import Harness, harness_dir

pytestmark = pytest.mark.slow

if harness_dir() is None:
    REASON = "the Letta Code harness (../shared/letta-code) is absent"
    sys.stderr.write(f"SKIP {__name__}: {REASON}\n")
    pytest.skip(REASON, allow_module_level=True)


class Agents:
    def __init__(self, harness: Harness, db: Path, a: str, b: str) -> None:
        self.harness, self.db, self.a, self.b = harness, db, a, b
        self.client = LettaCodeClient(harness.url, timeout=15, turn_timeout=120)

    def bash(self, agent: str, command: str) -> None:
        """Make ``agent`` run ``command`` with its Bash tool (one turn, then the socket is closed)."""
        call = {"name": "Bash", "arguments": {"command": command, "description": "schedule a prompt"}}
        self.client.send(agent, f"MOCK_TOOL_CALL {json.dumps(call)}", otid=f"test-{uuid.uuid4().hex[:10]}")

    def texts(self, agent: str) -> list[tuple[str, str]]:
        """``(otid, text)`` of the agent's default conversation's user messages from PromptYoSelf."""
        out = []
        for m in self.client.messages(agent):
            otid = m.get("otid") or ""
            if otid.startswith("promptyoself-"):
                parts = m.get("content") or []
                if isinstance(parts, list):
                    text = " ".join(p.get("text", "") for p in parts if isinstance(p, dict))
                else:
                    text = str(parts)
                out.append((otid, text))
        return out


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    home = tmp_path_factory.mktemp("lc-accept")
    db = home / "pys.db"
    harness = Harness(home / "lc", extra_path=str(Path(sys.executable).parent), pass_env={
        "PROMPTYOSELF_DB": str(db),
        "PROMPTYOSELF_ENV_FILE": str(home / "none.env"),
        "PROMPTYOSELF_EXECUTOR_INTERVAL": "0.5",
        "PROMPTYOSELF_RETRY_BASE": "0.5",
        "PROMPTYOSELF_RETRY_MAX": "2",
        "PROMPTYOSELF_OVERLAP_POLL": "0.5",  # a prompt queued behind a running turn asks again soon
    })
    harness.pass_env["LETTA_CODE_URL"] = harness.url
    harness.setup()
    a = harness.start()
    b = harness.add_agent("pys-agent-b")
    try:
        yield Agents(harness, db, a, b)
    finally:
        kill_all(db)
        harness.stop()


def schedules(db: Path) -> list[Schedule]:
    core = make_core(db)
    try:
        with core.store.session() as s:
            return list(s.execute(select(Schedule).order_by(Schedule.id)).scalars())
    finally:
        core.close()


def deliveries(db: Path, schedule_id: int) -> list[Delivery]:
    core = make_core(db)
    try:
        with core.store.session() as s:
            return list(s.execute(select(Delivery).where(Delivery.schedule_id == schedule_id)).scalars())
    finally:
        core.close()


def test_agent_schedules_in_5s_and_it_arrives_once_with_no_client(agents: Agents) -> None:
    assert not agents.db.exists() or not schedules(agents.db)  # an empty database
    # due after the scheduling turn has ended (``bash`` returns once it has, closing its socket)
    agents.bash(agents.a, "promptyoself schedule --prompt 'accept-A: check the build' --time 'in 5s'")
    rows = wait_until(lambda: [s for s in schedules(agents.db) if s.agent_id == agents.a], timeout=30)
    row = rows[0]
    assert (row.target, row.schedule_type, row.state) == ("letta-code", "once", "active")
    # Nothing is connected now: the prompt must come from PromptYoSelf's own worker.
    wait_until(lambda: schedules(agents.db)[0].state == "completed", timeout=90, interval=0.5)
    done = [d for d in deliveries(agents.db, row.id) if d.outcome == "delivered"]
    assert len(done) == 1 and done[0].lateness_s is not None, done  # how late: a figure, not asserted
    assert done[0].letta_run_id and "promptyoself-" in done[0].letta_run_id
    got = [t for t in agents.texts(agents.a) if "accept-A" in t[1]]
    assert len(got) == 1, got
    assert got[0][0].split("~")[0] == f"promptyoself-{row.id}-{int(done[0].scheduled_for.timestamp() * 1000)}"


def test_recurring_arrives_once_per_slot_across_a_restart_and_agents_stay_apart(agents: Agents) -> None:
    # the shortest period allowed (PROMPTYOSELF_MIN_INTERVAL, 10 s): one slot before the restart, two after
    agents.bash(agents.b, "promptyoself schedule --prompt 'accept-B: stretch' --every 10s --max-repetitions 3")
    row = wait_until(lambda: next((s for s in schedules(agents.db) if s.agent_id == agents.b), None), timeout=30)
    assert row.target == "letta-code"
    wait_until(lambda: (next(s for s in schedules(agents.db) if s.id == row.id).repetition_count or 0) >= 1,
               timeout=60, interval=0.5)
    agents.harness.restart()  # Letta Code goes away and comes back; delivery carries on
    wait_until(lambda: next(s for s in schedules(agents.db) if s.id == row.id).state == "completed",
               timeout=120, interval=0.5)
    got_b = [t for t in agents.texts(agents.b) if "accept-B" in t[1]]
    slots = [otid.split("~")[0] for otid, _ in got_b]
    assert len(got_b) == 3 and len(set(slots)) == 3, got_b
    assert [d.outcome for d in deliveries(agents.db, row.id)].count("delivered") == 3
    # two agents never see each other's prompts
    assert not [t for t in agents.texts(agents.a) if "accept-B" in t[1]]
    assert not [t for t in agents.texts(agents.b) if "accept-A" in t[1]]


def test_validation_asks_the_app_server_not_letta_base_url(agents: Agents) -> None:
    """The agent's Bash has LETTA_BASE_URL=https://api.letta.com; an unknown local agent is refused
    by the App Server (agent_not_found), not by a request to Letta Cloud."""
    out = agents.harness.home / "work" / "validation.json"
    agents.bash(agents.a, "echo $LETTA_BASE_URL > base_url.txt; LETTA_AGENT_ID=agent-local-00000000-0000-0000-0000-"
                          f"000000000000 promptyoself schedule --prompt x --time 'in 1h' > {out} 2>&1; true")
    wait_until(lambda: out.exists() and out.read_text().strip(), timeout=30)
    assert (agents.harness.home / "work" / "base_url.txt").read_text().strip() == "https://api.letta.com"
    answer = json.loads(out.read_text().strip().splitlines()[-1])
    assert answer["code"] == "agent_not_found" and "Letta Code App Server" in answer["error"], answer


def cli(*args: str, db: Path, url: str) -> tuple[int, dict]:
    env = child_env(db, None, LETTA_CODE_URL=url)
    done = subprocess.run([sys.executable, "-m", "promptyoself", *args, "--json"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_install_survives_the_running_server_and_uninstall_removes_it(agents: Agents) -> None:
    """Issue 32 point 4: install while the App Server runs exits 0 (the skill at once, the MCP entry
    queued); a watcher adds the entry once the server stops, and the server's next turns keep it."""
    from promptyoself.targets.letta_code import install as letta_code

    h = agents.harness
    home = str(h.letta_home)
    pending = h.letta_home / letta_code.PENDING
    code, out = cli("letta-code", "install", "--agent-id", agents.a, "--letta-home", home, db=agents.db, url=h.url)
    assert code == 0 and out["mcp_entry"] == "queued", out  # the server runs: queued, not refused
    skill = h.letta_home / "skills" / "promptyoself" / "SKILL.md"
    assert "promptyoself schedule" in skill.read_text() and "LETTA_AGENT_ID" in skill.read_text()
    h.stop()
    wait_until(lambda: not pending.exists(), timeout=30)
    h.start()
    for _ in range(2):  # the agent's next turns: the server has read and rewritten settings.json by now
        agents.client.send(agents.a, "hello after install", otid=f"test-{uuid.uuid4().hex[:10]}")

    def ours() -> list[dict]:
        data = json.loads(h.settings_json.read_text())
        entry = next(e for e in data["agents"] if e["agentId"] == agents.a)
        return [s for s in entry.get("mcpServers") or [] if s.get("name") == "promptyoself"]

    assert ours() and ours()[0]["env"]["PROMPTYOSELF_DB"].endswith(str(agents.db))
    assert ours()[0]["env"]["PROMPTYOSELF_AGENT_TOKEN"].startswith("pys_agent_")
    code, out = cli("letta-code", "uninstall", "--agent-id", agents.a, "--letta-home", home, db=agents.db, url=h.url)
    assert code == 0 and out["mcp_entry"] == "queued" and not skill.exists(), out
    h.stop()
    wait_until(lambda: not pending.exists(), timeout=30)
    h.start()
    agents.client.send(agents.a, "hello after uninstall", otid=f"test-{uuid.uuid4().hex[:10]}")
    assert not ours() and not skill.exists()


def exited(pid: int) -> bool:
    """The process ``pid`` is gone, or has exited and waits to be reaped by its parent (a zombie)."""
    import os

    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_queued_entry_is_kept_across_an_immediate_restart(agents: Agents) -> None:
    """Issue 45 point 2: `letta-code install` while the App Server runs queues the MCP entry; a restart
    with no pause (stop.sh then start.sh at once, as a supervisor restarts) left no moment without a
    server, and the old watcher waited for one while the new server ran without the entry. Here the
    watcher is even held (SIGSTOP) across the restart, so the new server reads settings.json before
    the watcher can write anything: the entry must still land in settings.json, outlive the new
    server's own write-back (its first turn), and be read by the server of the next immediate
    restart, which keeps it through its own write-back once the watcher is gone."""
    import os
    import signal

    from promptyoself.targets.letta_code import install as letta_code

    h = agents.harness
    home = str(h.letta_home)
    pending = h.letta_home / letta_code.PENDING
    watcher_pid = h.letta_home / letta_code.WATCHER_PID

    def ours() -> list[dict]:
        data = json.loads(h.settings_json.read_text())
        entry = next(e for e in data["agents"] if e["agentId"] == agents.a)
        return [s for s in entry.get("mcpServers") or [] if s.get("name") == "promptyoself"]

    def turn(text: str) -> None:
        agents.client.send(agents.a, text, otid=f"test-{uuid.uuid4().hex[:10]}")

    code, out = cli("letta-code", "install", "--agent-id", agents.a, "--letta-home", home, db=agents.db, url=h.url)
    assert code == 0 and out["mcp_entry"] == "queued", out
    watcher = int(out["watcher_pid"])
    os.kill(watcher, signal.SIGSTOP)
    try:
        before = letta_code.running_servers(h.letta_home)
        h.stop()
        h.start()  # at once
    finally:
        os.kill(watcher, signal.SIGCONT)
    assert letta_code.running_servers(h.letta_home) != before  # another server
    token = wait_until(lambda: ours() and ours()[0]["env"]["PROMPTYOSELF_AGENT_TOKEN"], timeout=30)
    assert token.startswith("pys_agent_")
    turn("first turn after the quick restart")  # the server writes its own copy of settings.json back
    wait_until(ours, timeout=30)  # dropped or not, the entry is in the file again
    h.stop()
    h.start()  # at once again, the watcher running
    wait_until(lambda: not pending.exists() and not watcher_pid.exists(), timeout=30)
    # the watcher removes its pid file on its way out, a moment before it has exited
    wait_until(lambda: exited(watcher), timeout=30)
    turn("first turn of the server that read the entry")  # its write-back keeps what it read
    assert [s["env"]["PROMPTYOSELF_AGENT_TOKEN"] for s in ours()] == [token]
    # clean up for the module's other tests: uninstalled across one more immediate restart
    code, out = cli("letta-code", "uninstall", "--agent-id", agents.a, "--letta-home", home, db=agents.db, url=h.url)
    assert code == 0 and out["mcp_entry"] == "queued", out
    h.stop()
    h.start()
    wait_until(lambda: not pending.exists() and not watcher_pid.exists(), timeout=30)
    turn("after uninstall")
    assert ours() == []
