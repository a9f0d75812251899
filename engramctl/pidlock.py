"""An exclusive advisory lock on a file that also records the holder's pid (daemon, snapshot store)."""

from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory lock, single-process use is on the user
    fcntl = None  # type: ignore[assignment]


def try_lock(path: Path) -> int | None:
    """Lock `path` (created 0600) and write our pid into it. Returns the held fd, or None when another
    process holds the lock. Closing the fd releases it."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
