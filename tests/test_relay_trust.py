"""The stdio relay trusts only itself (issue 23, point 1): its settings (Letta key, HTTP token) go only
to a listener running as this user, in a runtime folder no one else can swap, and the service serves
only connections from its own user and never changes a folder's mode through a symlink.

The second local user is a real second uid: a child process started as root that drops to an unused
uid with ``setuid`` (no entry in /etc/passwd is needed for that, so the machine is left as it was).
Where the tests do not run as root, no second uid can be had: they skip and say so."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from promptyoself.faces import relay
from promptyoself.faces.relay import connect, db_url_from, socket_path, trusted_folder
from promptyoself.faces.relay_server import RelayListener, _own_folder
from tests.procs import PYTHON, bare_env
from tests.test_stdio_relay import Service

OTHER_UID = 4242  # no such user here: a uid only our child processes take

needs_root = pytest.mark.skipif(
    os.name != "posix" or os.getuid() != 0,
    reason="a second local user needs root (setuid/chown); these tests run as an ordinary user",
)


@pytest.fixture
def tmp_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No private XDG_RUNTIME_DIR: the relay falls back to ``$TMPDIR/runtime-<uid>``, the case the
    red team used (root, containers, many services)."""
    if Path(f"/run/user/{os.getuid()}").is_dir():
        pytest.skip(f"/run/user/{os.getuid()} exists, so the $TMPDIR fallback is never used here")
    if not sys.platform.startswith("linux"):
        pytest.skip("the $TMPDIR/runtime-<uid> fallback is worked out by the relay on Linux only")
    base = Path(tempfile.mkdtemp(prefix="pys-tr-"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(base))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _values(db: Path) -> dict[str, str]:
    return {"PROMPTYOSELF_DB": str(db), "LETTA_API_KEY": "sk-let-secret", "PROMPTYOSELF_HTTP_TOKEN": "tok-secret"}


def _listener(db: Path) -> RelayListener:
    from promptyoself.config import Settings
    from promptyoself.core.operations import Core

    return RelayListener(Core(Settings(db=str(db))), build=lambda core: None)


LISTEN_AS = textwrap.dedent("""
    import os, socket, sys
    path, uid = sys.argv[1], int(sys.argv[2])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)                 # the socket file as root made it (so its owner looks right)
    os.setuid(uid)               # and the listener another user: what SO_PEERCRED reports
    s.listen(8)
    s.settimeout(20)
    print("ready", flush=True)
    try:
        conn, _ = s.accept()
    except TimeoutError:
        print(0, flush=True)
        raise SystemExit
    conn.settimeout(3)
    got = b""
    try:
        while True:
            part = conn.recv(65536)
            if not part:
                break
            got += part
    except TimeoutError:
        pass
    print(len(got), flush=True)
""")


def test_a_folder_of_ours_inside_a_private_parent_is_trusted(tmp_runtime: Path) -> None:
    folder = tmp_runtime / f"runtime-{os.getuid()}" / "promptyoself"
    assert _own_folder(str(folder)) is False  # the fallback folder is made by runtime_dir(create=True)
    assert relay.runtime_dir(create=True) == str(folder)
    assert _own_folder(str(folder)) is True
    assert stat.S_IMODE(folder.lstat().st_mode) == 0o700 and trusted_folder(str(folder))


@pytest.mark.slow
@needs_root
def test_a_runtime_folder_another_user_made_is_refused_by_both_sides(
    tmp_runtime: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The hijack: another user created ``$TMPDIR/runtime-<our uid>`` first. The service does not
    listen there and the relay sends nothing there, whatever listens."""
    planted = tmp_runtime / f"runtime-{os.getuid()}"
    planted.mkdir(mode=0o777)
    (planted / "promptyoself").mkdir(mode=0o700)
    os.chown(planted, OTHER_UID, OTHER_UID)
    db = tmp_path / "relay.db"
    with caplog.at_level(logging.WARNING, logger="promptyoself.faces.relay_server"):
        assert _listener(db)._bind() is None
    assert "stdio relay off" in caplog.text and str(planted) in caplog.text

    # a listener of theirs at our socket's path: the relay does not even connect
    path = socket_path(db_url_from(_values(db)))
    proc = subprocess.Popen([PYTHON, "-c", LISTEN_AS, path, str(OTHER_UID)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert connect(_values(db), timeout=2) is None
    finally:
        proc.kill()
        proc.wait()


def test_a_parent_others_may_write_to_is_refused(tmp_runtime: Path, tmp_path: Path) -> None:
    """Our own fallback folder, but group- or world-writable: anyone could rename our folder away
    and put theirs in its place between a check and a connect."""
    parent = tmp_runtime / f"runtime-{os.getuid()}"
    parent.mkdir()
    os.chmod(parent, 0o777)
    db = tmp_path / "relay.db"
    assert _listener(db)._bind() is None
    assert not (parent / "promptyoself").exists()
    (parent / "promptyoself").mkdir(mode=0o700)
    assert not trusted_folder(str(parent / "promptyoself"))
    assert connect(_values(db), timeout=2) is None


def test_nothing_is_chmod_ed_through_a_symlink(tmp_runtime: Path, tmp_path: Path) -> None:
    """A symlink planted where the relay folder goes: refused, and its target keeps its mode (the red
    team saw a root-owned 0755 folder turned 0700)."""
    parent = tmp_runtime / f"runtime-{os.getuid()}"
    parent.mkdir(mode=0o700)
    target = tmp_path / "somebody-elses"
    target.mkdir()
    os.chmod(target, 0o755)
    (parent / "promptyoself").symlink_to(target)
    assert _listener(tmp_path / "relay.db")._bind() is None
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert connect(_values(tmp_path / "relay.db"), timeout=2) is None


@pytest.mark.slow
@needs_root
def test_the_relay_checks_who_listens_after_connecting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the red team won (2 of 40): the folder checks pass, then another user's listener is
    at the socket. The relay asks the kernel who listens (SO_PEERCRED) and sends it nothing."""
    runtime = Path(tempfile.mkdtemp(prefix="pys-tr-"))
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        db = tmp_path / "relay.db"
        path = socket_path(db_url_from(_values(db)))
        assert relay.runtime_dir(create=True)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        assert trusted_folder(os.path.dirname(path))
        proc = subprocess.Popen([PYTHON, "-c", LISTEN_AS, path, str(OTHER_UID)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        try:
            assert proc.stdout.readline().strip() == "ready"
            assert os.lstat(path).st_uid == os.getuid()  # every check on the path passes
            assert connect(_values(db), timeout=2) is None
            assert proc.stdout.readline().strip() == "0"  # it accepted us and got not one byte
        finally:
            proc.kill()
            proc.wait()
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


CONNECT_AS = textwrap.dedent("""
    import json, os, socket, sys
    path, uid, hello = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    os.setuid(uid)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    s.sendall(hello.encode() + b"\\n")
    got = b""
    try:
        while True:
            part = s.recv(65536)
            if not part:
                break
            got += part
    except ConnectionResetError:  # closed with our handshake unread: no answer either
        pass
    print(json.dumps(got.decode(errors="replace")), flush=True)
""")


@pytest.mark.slow
@needs_root
def test_the_service_serves_no_other_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even with its folder and socket opened to everyone (a careless chmod), a connection from another
    user gets no answer at all; the service logs it."""
    runtime = Path(tempfile.mkdtemp(prefix="pys-tr-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    try:
        db = tmp_path / "relay.db"
        svc = Service(db, runtime)
        try:
            os.chmod(runtime, 0o755)
            os.chmod(svc.socket.parent, 0o755)
            os.chmod(svc.socket, 0o777)
            db_url = db_url_from({"PROMPTYOSELF_DB": str(db)})
            hello = json.dumps({"promptyoself_relay": 1, "db": db_url, "settings": {"PROMPTYOSELF_DB": db_url},
                                "pid": 1})
            out = subprocess.run([PYTHON, "-c", CONNECT_AS, str(svc.socket), str(OTHER_UID), hello],
                                 capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout) == ""
            assert f"refused a connection from user {OTHER_UID}" in svc.stderr()
        finally:
            svc.stop()
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


@pytest.mark.slow
def test_the_relay_still_reaches_a_service_of_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="pys-tr-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    try:
        db = tmp_path / "relay.db"
        svc = Service(db, runtime)
        try:
            for key in [k for k in os.environ if k.startswith(("PROMPTYOSELF_", "LETTA_"))]:
                monkeypatch.delenv(key)
            for key, value in bare_env(db, XDG_RUNTIME_DIR=str(runtime)).items():
                monkeypatch.setenv(key, value)
            sock = connect(relay.visible_settings(), timeout=10)
            assert sock is not None
            sock.close()
        finally:
            svc.stop()
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
