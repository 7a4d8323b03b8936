"""One owner per data dir: a master, a bridge or ``exo-deploy log repair`` holds an exclusive
lock on ``owner.lock`` in the data dir while it uses it, so a second process on the same dir
stops at once, naming the dir and the holder's pid, instead of both appending to one log
(indices written twice, acknowledged deployments lost at the next start).

POSIX record locks (``fcntl.lockf``), not ``flock``: the kernel drops them when the holder dies
however it dies (``kill -9`` included), so a crashed owner never leaves the dir locked, and they
are per process, so a process that opens its own dir again (a test restarting a master in
place) is not refused by itself. The pid written in the file is only for the message.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "owner.lock"


class DataDirInUseError(Exception):
    """Another process holds the data dir."""

    def __init__(self, data_dir: Path, holder: str) -> None:
        super().__init__(
            f"data dir {data_dir} is in use by process {holder}: one master, bridge or log "
            "repair at a time; stop it first, or give this one another --data-dir"
        )
        self.data_dir = data_dir
        self.holder = holder


class DataDirLock:
    """The held lock; ``release`` (or the process ending) lets the next owner in."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the process's lock
            self._fd = None


def lock_data_dir(data_dir: Path) -> DataDirLock:
    """Take ``data_dir`` for this process, or raise ``DataDirInUseError`` naming the holder."""
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DataDirInUseError(data_dir, holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return DataDirLock(fd)
