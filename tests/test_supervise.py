"""``promptyoself service install|uninstall|status`` (issue 10, point 2): the files' content, written
under a temporary HOME / XDG_CONFIG_HOME, never the real system; and the Docker files of docs/deployment.md."""

from __future__ import annotations

import json
import plistlib
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from promptyoself.core import supervise
from promptyoself.faces import cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(h / "cfg"))
    monkeypatch.setenv("PROMPTYOSELF_DB", str(tmp_path / "svc.db"))
    monkeypatch.setenv("LETTA_BASE_URL", "http://letta.example:8283")
    monkeypatch.setenv("LETTA_API_KEY", "sk-very-secret")
    # This machine has no systemd as PID 1; pin it so the test never calls systemctl either way.
    monkeypatch.setattr(supervise, "systemd_running", lambda: False)
    return h


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def ini(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def test_install_writes_a_user_unit_and_its_settings(home: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "service", "install", "--json")
    assert code == 0, out
    result = json.loads(out)
    unit = home / "cfg" / "systemd" / "user" / "promptyoself.service"
    env_file = home / "cfg" / "promptyoself" / "promptyoself.env"
    assert result["unit_path"] == str(unit) and result["env_file"] == str(env_file)
    assert result["started"] is False and "systemd is not running here" in result["message"]
    keys = ini(unit.read_text())
    assert keys["ExecStart"] == [f"{sys.executable} -m promptyoself serve --host 127.0.0.1 --port 8000"]
    assert Path(sys.executable).is_absolute()
    assert keys["Restart"] == ["on-failure"] and keys["EnvironmentFile"] == [f"-{env_file}"]
    assert keys["WantedBy"] == ["default.target"] and "User" not in keys
    # a user manager has no network-online.target: the user unit waits for nothing
    assert "After" not in keys and "Wants" not in keys and "network-online" not in unit.read_text()
    assert keys["NoNewPrivileges"] == ["yes"] and keys["ProtectSystem"] == ["strict"]
    assert keys["RestartPreventExitStatus"] == ["2"]  # a bad setting is not retried every 5 s
    assert keys["LimitNOFILE"] == ["65536"]  # descriptors for the open connections (issue 29 item 6)
    assert keys["ReadWritePaths"] == [f"-{tmp_path}", "-%t"]  # the database's folder, the relay's socket
    assert keys.get("PrivateTmp") is None or tmp_path.is_relative_to("/tmp")
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    env = ini(env_file.read_text())
    assert env["PROMPTYOSELF_DB"] == [f'"sqlite:///{tmp_path / "svc.db"}"']
    assert env["LETTA_BASE_URL"] == ['"http://letta.example:8283"'] and env["LETTA_API_KEY"] == ['"sk-very-secret"']
    # a second install keeps the settings the user may have edited
    env_file.write_text("LETTA_BASE_URL=http://edited\n")
    assert run(capsys, "service", "install", "--json")[0] == 0
    assert env_file.read_text() == "LETTA_BASE_URL=http://edited\n"

    code, out = run(capsys, "service", "status", "--json")
    status = json.loads(out)
    assert code == 0 and status["unit"]["installed"] is True and status["worker"] is None
    assert "no worker lease" in status["message"]

    code, out = run(capsys, "service", "uninstall", "--json")
    assert code == 0 and json.loads(out)["removed"] is True and not unit.exists() and env_file.exists()
    code, out = run(capsys, "service", "status", "--json")
    assert json.loads(out)["unit"]["installed"] is False


def test_print_only_prints_and_masks_secrets(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "service", "install", "--system", "--print", "--port", "8100")
    assert code == 0
    assert "# /etc/systemd/system/promptyoself.service" in out and "WantedBy=multi-user.target" in out
    assert "EnvironmentFile=-/etc/promptyoself/promptyoself.env" in out and "--port 8100" in out
    assert "sk-very-secret" not in out and 'LETTA_API_KEY="***"' in out
    assert not (home / "cfg").exists()


def test_launchd_plist(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "service", "install", "--kind", "launchd", "--json")
    assert code == 0, out
    path = home / "Library" / "LaunchAgents" / "dev.promptyoself.service.plist"
    assert json.loads(out)["unit_path"] == str(path)
    plist = plistlib.loads(path.read_bytes())
    assert plist["Label"] == "dev.promptyoself.service"
    assert plist["ProgramArguments"][:4] == [sys.executable, "-m", "promptyoself", "serve"]
    assert plist["KeepAlive"] == {"SuccessfulExit": False} and plist["RunAtLoad"] is True
    assert plist["EnvironmentVariables"]["LETTA_API_KEY"] == "sk-very-secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_service_status_shows_the_worker_lease(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os
    from datetime import timedelta

    from promptyoself.config import load_settings
    from promptyoself.core.operations import Core
    from promptyoself.deps import system_clock as utcnow
    from promptyoself.processes import hostname
    from promptyoself.store.db import WorkerLease

    core = Core(load_settings())
    now = utcnow()
    with core.store.session() as s:
        s.add(WorkerLease(name="worker", owner="service:x", pid=os.getpid(), host=hostname(), started_at=now,
                          heartbeat_at=now, lease_until=now + timedelta(seconds=60)))
    core.close()
    status = json.loads(run(capsys, "service", "status", "--json")[1])
    assert status["worker"]["pid"] == os.getpid() and status["worker"]["alive"] is True
    assert f"service pid {os.getpid()}" in status["message"]


@pytest.mark.slow
def test_the_cli_help_lists_service(capsys: pytest.CaptureFixture[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "promptyoself", "service", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "install" in proc.stdout and "uninstall" in proc.stdout


# ---- Docker (docs/deployment.md): no `docker compose` here, so the compose file is checked as YAML ----


def test_compose_runs_letta_postgres_and_promptyoself_together() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"letta", "postgres", "promptyoself"}
    assert services["letta"]["image"] == "letta/letta:0.16.8"
    assert services["postgres"]["image"].startswith("pgvector/pgvector:")  # Letta needs pgvector
    app = services["promptyoself"]
    assert app["build"]["context"] == "."
    env = app["environment"]
    assert env["LETTA_BASE_URL"] == "http://letta:8283"
    assert env["PROMPTYOSELF_DB"].startswith("postgresql+psycopg://") and "@postgres:5432/" in env["PROMPTYOSELF_DB"]
    assert "PROMPTYOSELF_HTTP_TOKEN" in env
    assert app["ports"] == ["127.0.0.1:8000:8000"]
    assert "--allow-external" in app["command"] and "0.0.0.0" in app["command"]
    depends = app["depends_on"]
    assert depends["postgres"]["condition"] == "service_healthy" and "letta" in depends
    assert "/readyz" in " ".join(app["healthcheck"]["test"])  # not /healthz: a Letta outage is not unhealthy
    assert services["letta"]["environment"]["LETTA_PG_URI"].endswith("@postgres:5432/letta")
    init = (ROOT / "docker" / "postgres-init.sql").read_text()
    assert "CREATE DATABASE promptyoself" in init and "vector" in init
    assert any(v.startswith("./docker/postgres-init.sql:") for v in services["postgres"]["volumes"])


def test_compose_takes_the_token_from_env_and_restarts_and_checks_every_service() -> None:
    import re

    text = (ROOT / "docker-compose.yml").read_text()
    services = yaml.safe_load(text)["services"]
    for name, service in services.items():
        assert service.get("restart") in ("unless-stopped", "always", "on-failure"), name
        assert service.get("healthcheck", {}).get("test"), name
    # every ${VAR} has a default: `logs`, `ps` and `down` work in a shell without the variables (compose
    # interpolates the whole file for every command); the token comes from .env, never generated on `up`
    for match in re.finditer(r"\$\{([^}]*)\}", text):
        assert ":-" in match.group(1), match.group(0)
    assert services["promptyoself"]["environment"]["PROMPTYOSELF_HTTP_TOKEN"] == "${PROMPTYOSELF_HTTP_TOKEN:-}"
    assert "openssl rand" not in text.split("services:")[1]
    assert services["promptyoself"]["depends_on"]["letta"]["condition"] == "service_healthy"
    assert "/v1/health/" in " ".join(services["letta"]["healthcheck"]["test"])
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Docker Compose"):]
    assert "PROMPTYOSELF_HTTP_TOKEN=$(openssl rand -hex 24)\" > .env" in section
    assert "docker compose exec promptyoself promptyoself letta install-tools" in section


def test_dockerfile_runs_the_service() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "\nFROM python:3.1" in text and '".[postgres]"' in text
    assert 'ENTRYPOINT ["python", "-m", "promptyoself"]' in text
    assert 'CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--allow-external"]' in text
    assert "HEALTHCHECK" in text and "/readyz'" in text and "USER " in text


@pytest.mark.slow
def test_the_units_pass_systemd_analyze_and_keep_tmp_private(home: Path, tmp_path: Path) -> None:
    import shutil
    import subprocess

    from promptyoself.core import supervise

    data = Path("/var/lib/promptyoself data")  # a database outside /tmp: PrivateTmp=yes (a space: quoted)
    unit = supervise.systemd_unit(system=False, env_path=home / "p.env", host="127.0.0.1", port=8000, user=None,
                                  writable=[data])
    keys = ini(unit)
    assert keys["PrivateTmp"] == ["yes"] and keys["ReadWritePaths"] == [f'-"{data}"', "-%t"]
    system = ini(supervise.systemd_unit(system=True, env_path=home / "p.env", host="127.0.0.1", port=8000,
                                        user="alice", writable=[data]))
    assert system["After"] == ["network-online.target"] and system["WantedBy"] == ["multi-user.target"]
    assert system["User"] == ["alice"] and system["ReadWritePaths"] == [f'-"{data}"']
    assert supervise.writable_paths("postgresql+psycopg://u@h/db", {}) == []
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: the unit's syntax was checked above only")
    folder = tmp_path / "units"
    folder.mkdir()
    for name, text in (("promptyoself.service", unit),):
        (folder / name).write_text(text)
        proc = subprocess.run([analyze, "verify", str(folder / name)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Unknown key" not in proc.stderr and "Invalid" not in proc.stderr, proc.stderr
