"""This host's processes, with the standard library only: the host's name as leases record it, and
whether a pid is a running process. One helper for the worker lease (``who_delivers``, the store,
the worker) and the targets that run an agent CLI (is a session's process still running?)."""

from __future__ import annotations

import os
import socket


def hostname() -> str:
    """This host's name as a lease records it (at most 200 characters)."""
    return socket.gethostname()[:200]


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a running (not zombie) process on this host. A process we may not signal
    (another user's) counts as running."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (macOS) or it went meanwhile: kill(0) said it was there
    return state not in ("Z", "X")
