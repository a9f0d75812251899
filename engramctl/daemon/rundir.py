"""The daemon's run directory: who runs, where it listens, where it logs.

Files in settings.paths.run_dir:
- daemon.pid  the pid, flock-ed by the daemon for its whole life: a lock nobody holds means no daemon
              (a SIGKILLed daemon leaves the file, not the lock), so stale files are never trusted;
- daemon.json where it listens and what it serves (pid, url, host, port, model, device, dtype, started,
              state "loading" | "ready").
The background daemon logs to settings.paths.log_dir/daemon.log.
"""

from __future__ import annotations

import os
from pathlib import Path

from engramctl.errors import EngramError
from engramctl.pidlock import try_lock

TYPE_CHECKING = False  # typing's, without importing typing: `snapshots ls` imports none of it (~4% of its time)
if TYPE_CHECKING:
    from typing import Any

    from engramctl.paths import Paths
    from engramctl.settings import Settings  # not at run time: `snapshots ls` imports no settings (paths.py)

PID_FILE = "daemon.pid"
STATE_FILE = "daemon.json"
LOG_FILE = "daemon.log"


def log_file(settings: Settings) -> Path:
    """The background daemon's log file (`engramctl daemon logs` shows it)."""
    return settings.paths.log_dir / LOG_FILE


def pid_path(paths: Paths) -> Path:
    return paths.run_dir / PID_FILE


def state_path(settings: Settings) -> Path:
    return settings.paths.run_dir / STATE_FILE


def client_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def url_for(host: str, port: int) -> str:
    h = client_host(host)
    return f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}"


class RunLock:
    """Held by the running daemon: flock on daemon.pid."""

    def __init__(self, settings: Settings):
        self.path = pid_path(settings.paths)
        self.fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = try_lock(self.path)
        if fd is None:
            pid = _read_pid(self.path)
            raise EngramError(
                f"a daemon is already running for this data directory (pid {pid or '?'}).",
                hint="engramctl daemon status / engramctl daemon stop",
            )
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self.fd)
            self.fd = None


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def running_pid(paths: Paths) -> int | None:
    """The pid of the daemon holding the lock in these paths' run dir, or None when none runs."""
    import fcntl

    path = pid_path(paths)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(path) or -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def write_state(settings: Settings, state: dict[str, Any]) -> None:
    import json  # in the functions: `snapshots ls` with no daemon running reads no state

    path = state_path(settings)
    tmp = path.with_suffix(".tmp")
    # 0600 like every file engramctl writes (the run dir is 0700 too): it says where the daemon listens
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a .tmp left by an older version keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(state, indent=1))
    os.replace(tmp, path)


def read_state(settings: Settings) -> dict[str, Any] | None:
    import json

    try:
        return json.loads(state_path(settings).read_text())
    except (OSError, ValueError):
        return None


def tls_for(url: str) -> Any:
    """httpx's `verify` for a client of `url`: the system's CA bundle (True) for https; for plain http, a TLS
    context that loads none. httpx makes one for every client, and loading the bundle takes ~90 ms (a `ps` made
    five clients: half its time) for a connection that uses no TLS; one that did would verify against nothing
    and fail, not pass."""
    if url.startswith("https://"):
        return True
    import ssl

    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def daemon_url(settings: Settings) -> str:
    """Where this data directory's daemon listens: its state file while it runs, else the settings."""
    if running_pid(settings.paths) is not None:
        state = read_state(settings)
        if state and state.get("url"):
            return str(state["url"])
    return url_for(settings.host, settings.port)
