"""A SQLite database made read-only for real, for the tests of health and delivery with a database
that cannot be written (issue 29 item 4).

As root: the immutable attribute (what ``chattr +i`` sets, through the same ``FS_IOC_SETFLAGS``
ioctl, in process) on the file, ``-wal`` and ``-shm``: root ignores permissions, an immutable file
refuses it. Otherwise: ``chmod a-w``, which the owner's own writes obey. Either way SQLite keeps
reading through its open connections and opens new ones read-only.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_IMMUTABLE_FL = 0x00000010


def files_of(db: Path) -> list[Path]:
    return [p for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists()]


def set_immutable(path: Path, on: bool) -> None:
    """``chattr +i``/``-i`` on ``path`` (root only; ext4, xfs, btrfs and tmpfs support it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        (flags,) = struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, struct.pack("i", 0)))
        flags = flags | FS_IMMUTABLE_FL if on else flags & ~FS_IMMUTABLE_FL
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", flags))
    finally:
        os.close(fd)


@contextmanager
def read_only(db: Path) -> Iterator[str]:
    """The database's files read-only while the block runs; writable again on the way out (before
    the core closes: SQLite's last close writes to them). Yields how: ``chattr +i`` or ``chmod a-w``."""
    files = files_of(db)
    if os.geteuid() == 0:
        for p in files:
            set_immutable(p, True)
        try:
            yield "chattr +i"
        finally:
            for p in files:
                set_immutable(p, False)
    else:
        modes = {p: stat.S_IMODE(p.stat().st_mode) for p in files}
        for p, mode in modes.items():
            p.chmod(mode & ~0o222)
        try:
            yield "chmod a-w"
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
