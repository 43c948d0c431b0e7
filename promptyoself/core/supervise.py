"""``promptyoself service install|uninstall|status``: run ``promptyoself serve`` under the system's
supervisor, so that delivery survives reboots and crashes.

* Linux: a systemd unit, a user unit by default (``$XDG_CONFIG_HOME/systemd/user/promptyoself.service``)
  or a system unit with ``--system`` (``/etc/systemd/system/promptyoself.service``); ``Restart=on-failure``;
  settings from an ``EnvironmentFile`` (mode 0600: it may hold secrets); ``ExecStart`` with the absolute
  path of this interpreter. Where systemd runs (``systemctl`` present and PID 1 is systemd) install
  enables and starts it, uninstall stops and disables it.
* macOS: a launchd plist (``~/Library/LaunchAgents/dev.promptyoself.service.plist``, or
  ``/Library/LaunchDaemons`` with ``--system``) with ``KeepAlive`` on failure and the settings inline.

``--print`` only prints what would be written. Nothing here runs at import time.
"""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

from promptyoself.config import REDACTED, redact_url

if TYPE_CHECKING:
    from promptyoself.deps import Services

NAME = "promptyoself"
LAUNCHD_LABEL = "dev.promptyoself.service"
ENV_PREFIXES = ("PROMPTYOSELF_", "LETTA_")
SKIP_ENV = ("PROMPTYOSELF_ENV_FILE", "PROMPTYOSELF_TEST_PG_URL", "PROMPTYOSELF_WORKER_TOKEN", "PROMPTYOSELF_WORKER_LOG")


@dataclass(frozen=True)
class Plan:
    kind: str  # systemd | launchd
    system: bool
    unit_path: Path
    env_path: Path | None  # systemd only
    unit_text: str
    env_text: str
    writable: tuple[Path, ...] = ()  # folders the unit may write (made at install: a missing one stays read-only)


def default_kind() -> str:
    return "launchd" if sys.platform == "darwin" else "systemd"


def _config_home() -> Path:
    raw = os.environ.get("XDG_CONFIG_HOME", "").strip()
    return Path(raw) if raw else Path.home() / ".config"


def exec_args(host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "promptyoself", "serve", "--host", host, "--port", str(port)]


SECRET_ENV = ("LETTA_API_KEY", "LETTA_SERVER_PASSWORD", "PROMPTYOSELF_HTTP_TOKEN")


def settings_env(db_url: str, *, mask: bool = False) -> dict[str, str]:
    """The PromptYoSelf and Letta variables of this environment, plus the resolved database, so the
    service uses the same database and Letta as the command that installed it. ``mask`` hides
    secrets (for ``--print``); the files themselves get the real values and mode 0600."""
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(ENV_PREFIXES) and k not in SKIP_ENV and "\n" not in v}
    env["PROMPTYOSELF_DB"] = db_url
    if mask:
        for k, v in env.items():
            if k in SECRET_ENV and v:
                env[k] = REDACTED
            elif "://" in v:
                env[k] = redact_url(v)
    return env


def _env_file_text(env: dict[str, str]) -> str:
    lines = ["# PromptYoSelf service settings (systemd EnvironmentFile). Every variable: .env.example.",
             "# Written by `promptyoself service install`; edit, then `systemctl [--user] restart promptyoself`."]
    for k, v in env.items():
        quoted = '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines.append(f"{k}={quoted}")
    return "\n".join(lines) + "\n"


def writable_paths(db_url: str, env: dict[str, str]) -> list[Path]:
    """The folders the service writes: the SQLite database's (the file and its -wal/-shm journals,
    the token file beside it) and the log file's (``PROMPTYOSELF_LOG_FILE``)."""
    from promptyoself.config import token_file

    out: list[Path] = []
    if db_url.startswith("sqlite:///") and ":memory:" not in db_url:
        out.append(token_file(db_url).parent)
    log_file = env.get("PROMPTYOSELF_LOG_FILE", "").strip()
    if log_file:
        out.append(Path(log_file).expanduser().parent)
    return list(dict.fromkeys(out))


def systemd_unit(*, system: bool, env_path: Path, host: str, port: int, user: str | None,
                 writable: list[Path] | None = None) -> str:
    """The unit. A user unit waits for nothing (a user manager has no ``network-online.target``; the
    service retries Letta and the database itself) and is wanted by ``default.target``. Both are
    sandboxed: no new privileges, the file system read-only but for the database's and log's folders
    (and, for a user unit, the runtime folder holding the stdio relay's socket), a private /tmp. Exit
    code 2 (a bad setting or argument) is not restarted: it would fail the same way every 5 s."""
    args = " ".join(shlex.quote(a) for a in exec_args(host, port))
    lines = ["[Unit]", "Description=PromptYoSelf: scheduled prompts for Letta agents (delivery + HTTP)"]
    if system:
        lines += ["After=network-online.target", "Wants=network-online.target"]
    lines += [
        "",
        "[Service]",
        "Type=simple",
        f"EnvironmentFile=-{env_path}",
        "Environment=PYTHONUNBUFFERED=1",
        f"ExecStart={args}",
        "Restart=on-failure",
        "RestartSec=5",
        "RestartPreventExitStatus=2",  # a usage error or a port in use: restarting cannot fix it
        "TimeoutStopSec=20",
        "KillSignal=SIGTERM",
        "LimitNOFILE=65536",  # open connections (PROMPTYOSELF_HTTP_MAX_CONNECTIONS) need descriptors; 1,024 is too few
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ]
    in_tmp = [f for f in writable or [] if f.is_relative_to("/tmp") or f.is_relative_to("/var/tmp")]
    if in_tmp:  # a private /tmp would hide the database (or log) from the service
        lines.append(f"# PrivateTmp=yes is left out: {in_tmp[0]} is under /tmp.")
    else:
        lines.append("PrivateTmp=yes")
    lines += [f"ReadWritePaths=-{_unit_path(folder)}" for folder in writable or []]
    if not system:
        lines.append("ReadWritePaths=-%t")  # $XDG_RUNTIME_DIR: the stdio relay's socket (faces/relay.py)
    if system and user and user != "root":
        lines.append(f"User={user}")
    lines += ["", "[Install]", f"WantedBy={'multi-user.target' if system else 'default.target'}", ""]
    return "\n".join(lines)


def _unit_path(path: Path) -> str:
    """A path as a unit file takes it: ``%`` doubled (a specifier otherwise), spaces quoted."""
    text = str(path).replace("%", "%%")
    return f'"{text}"' if " " in text else text


def launchd_plist(*, env: dict[str, str], host: str, port: int, log_dir: Path) -> str:
    def s(text: str) -> str:
        return f"<string>{escape(text)}</string>"

    args = "\n".join(f"    {s(a)}" for a in exec_args(host, port))
    env_items = "\n".join(f"    <key>{escape(k)}</key>{s(v)}" for k, v in env.items())
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>Label</key>{s(LAUNCHD_LABEL)}
  <key>ProgramArguments</key>
  <array>
{args}
  </array>
  <key>EnvironmentVariables</key>
  <dict>
{env_items}
  </dict>
  <key>RunAtLoad</key><true/>
  <key>KeepAlive</key>
  <dict>
    <key>SuccessfulExit</key><false/>
  </dict>
  <key>ThrottleInterval</key><integer>5</integer>
  <key>StandardErrorPath</key>{s(str(log_dir / 'promptyoself-service.log'))}
  <key>StandardOutPath</key>{s('/dev/null')}
</dict>
</plist>
"""


def plan(db_url: str, *, system: bool, kind: str | None = None, host: str = "127.0.0.1", port: int = 8000,
         mask: bool = False) -> Plan:
    kind = kind or default_kind()
    env = settings_env(db_url, mask=mask)
    if kind == "launchd":
        if system:
            unit_path = Path("/Library/LaunchDaemons") / f"{LAUNCHD_LABEL}.plist"
            log_dir = Path("/Library/Logs")
        else:
            unit_path = Path.home() / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
            log_dir = Path.home() / "Library" / "Logs"
        text = launchd_plist(env=env, host=host, port=port, log_dir=log_dir)
        return Plan(kind, system, unit_path, None, text, "")
    if system:
        unit_path = Path("/etc/systemd/system") / f"{NAME}.service"
        env_path = Path("/etc") / NAME / f"{NAME}.env"
    else:
        unit_path = _config_home() / "systemd" / "user" / f"{NAME}.service"
        env_path = _config_home() / NAME / f"{NAME}.env"
    user = None if not system else _user()
    writable = writable_paths(db_url, env)
    text = systemd_unit(system=system, env_path=env_path, host=host, port=port, user=user, writable=writable)
    return Plan(kind, system, unit_path, env_path, text, _env_file_text(env), tuple(writable))


def _user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:
        return None


def systemd_running() -> bool:
    """``systemctl`` is installed and PID 1 is systemd (not so in most containers)."""
    if shutil.which("systemctl") is None:
        return False
    try:
        return Path("/proc/1/comm").read_text(encoding="ascii", errors="replace").strip() == "systemd"
    except OSError:
        return os.path.isdir("/run/systemd/system")


def _run(args: list[str]) -> tuple[int, str]:
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return p.returncode, (p.stdout + p.stderr).strip()


def _systemctl(system: bool, *args: str) -> list[str]:
    return ["systemctl", *([] if system else ["--user"]), *args]


def install(p: Plan) -> dict[str, Any]:
    for folder in p.writable:
        folder.mkdir(parents=True, exist_ok=True)
    p.unit_path.parent.mkdir(parents=True, exist_ok=True)
    p.unit_path.write_text(p.unit_text, encoding="utf-8")
    out: dict[str, Any] = {"status": "success", "kind": p.kind, "system": p.system, "unit_path": str(p.unit_path),
                           "env_file": str(p.env_path) if p.env_path else None, "env_file_written": False,
                           "started": False}
    if p.env_path is not None:
        if not p.env_path.exists():  # never overwrite settings the user edited
            p.env_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(p.env_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(p.env_text)
            out["env_file_written"] = True
    else:
        p.unit_path.chmod(0o600)  # the plist holds the settings, maybe secrets
    flag = "" if p.system else " --user"
    if p.kind == "systemd":
        if systemd_running():
            steps = [_systemctl(p.system, "daemon-reload"), _systemctl(p.system, "enable", "--now", f"{NAME}.service")]
            for args in steps:
                code, text = _run(args)
                if code != 0:
                    return {"status": "error", "code": "internal",
                            "error": f"Wrote {p.unit_path} but `{' '.join(args)}` failed: {text[:300]}"}
            out["started"] = True
            out["message"] = (f"Installed, enabled and started {NAME}.service ({'system' if p.system else 'user'} "
                              f"unit). Check it: promptyoself service status; promptyoself health.")
            if not p.system:
                out["message"] += " To keep it running after you log out: loginctl enable-linger."
        else:
            out["message"] = (f"Wrote {p.unit_path}. systemd is not running here (no systemctl, or PID 1 is not "
                              f"systemd): start `promptyoself serve` another way, or on a systemd host run "
                              f"`systemctl{flag} daemon-reload && systemctl{flag} enable --now {NAME}.service`.")
    elif sys.platform == "darwin" and shutil.which("launchctl"):
        code, text = _run(["launchctl", "load", "-w", str(p.unit_path)])
        out["started"] = code == 0
        out["message"] = (f"Loaded {p.unit_path}." if code == 0 else f"Wrote {p.unit_path}; launchctl load failed: "
                          f"{text[:300]}")
    else:
        out["message"] = f"Wrote {p.unit_path}. Load it on macOS with `launchctl load -w {p.unit_path}`."
    return out


def uninstall(p: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {"status": "success", "kind": p.kind, "unit_path": str(p.unit_path), "removed": False}
    if p.kind == "systemd" and systemd_running():
        _run(_systemctl(p.system, "disable", "--now", f"{NAME}.service"))
    elif p.kind == "launchd" and sys.platform == "darwin" and shutil.which("launchctl") and p.unit_path.exists():
        _run(["launchctl", "unload", "-w", str(p.unit_path)])
    if p.unit_path.exists():
        p.unit_path.unlink()
        out["removed"] = True
        if p.kind == "systemd" and systemd_running():
            _run(_systemctl(p.system, "daemon-reload"))
    kept = f" The settings file {p.env_path} is kept." if p.env_path is not None and p.env_path.exists() else ""
    out["message"] = (f"Removed {p.unit_path}." if out["removed"] else f"No unit at {p.unit_path}.") + kept
    return out


def unit_state(p: Plan) -> dict[str, Any]:
    """What the supervisor says about the unit (or that it cannot be asked here)."""
    state: dict[str, Any] = {"installed": p.unit_path.exists(), "unit_path": str(p.unit_path), "kind": p.kind}
    if p.kind == "systemd":
        if systemd_running():
            _, active = _run(_systemctl(p.system, "is-active", f"{NAME}.service"))
            _, enabled = _run(_systemctl(p.system, "is-enabled", f"{NAME}.service"))
            state.update(active=active.splitlines()[0] if active else "unknown",
                         enabled=enabled.splitlines()[0] if enabled else "unknown")
        else:
            state.update(active="unknown (systemd is not running here)", enabled="unknown")
    elif sys.platform == "darwin" and shutil.which("launchctl"):
        code, _ = _run(["launchctl", "list", LAUNCHD_LABEL])
        state.update(active="loaded" if code == 0 else "not loaded")
    return state


def status(core: Services, p: Plan) -> dict[str, Any]:
    """``service status``: the unit's state and the worker lease of the configured database."""
    from promptyoself.store import health as queries

    out: dict[str, Any] = {"status": "success", "unit": unit_state(p)}
    try:
        lease = queries.lease(core.store, core.now())
    except Exception as exc:
        out["worker"] = None
        out["message"] = f"The database cannot be read: {str(exc).splitlines()[0][:200]}. Run `promptyoself health`."
        return out
    out["worker"] = {k: lease[k] for k in queries.LEASE_SUMMARY} if lease else None
    unit = out["unit"]
    who = "no worker lease"
    if lease is not None:
        role = str(lease["owner"]).split(":", 1)[0]
        who = f"{role} pid {lease['pid']} on {lease['host']} ({'alive' if lease['alive'] else 'not alive'})"
    installed = "installed" if unit["installed"] else "not installed"
    out["message"] = f"Unit {unit['unit_path']}: {installed}, {unit.get('active', 'state unknown')}; delivery: {who}."
    return out
