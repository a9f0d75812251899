"""A daemon in the background, for `engramctl daemon start|stop|status` and the CLI's autostart:
`start_background` runs `python -m engramctl.daemon` detached (its output to the log file, the settings
passed as ENGRAM_* variables), `stop_background` ends it, `daemon_status` reads the run directory and asks
the daemon itself. The foreground process is runner.py's.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engramctl.daemon import exits
from engramctl.daemon.watch import child_env
from engramctl.daemon.rundir import log_file, pid_path, read_state, running_pid, tls_for
from engramctl.daemon.runner import check_host
from engramctl.errors import EngramError
from engramctl.settings import Settings, settings_env

try:
    import fcntl
except ImportError:  # Windows: no advisory lock
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("engramctl.daemon")

LOG_ROTATE_BYTES = 16 * 2**20
START_LOCK_FILE = "start.lock"
# What daemon_status() takes from /v1/status.
_STATUS_KEYS = """uptime_s rss_bytes weights_bytes backend weight_type n_params sessions queue turns hot pending_writes
family context_length started notices serving build prefetched warmup_ms""".split()


def _settings_env(settings: Settings) -> dict[str, str]:
    """Every daemon setting as its ENGRAM_* variable (flags and config.toml included), with a local
    model path made absolute: the daemon runs in the data directory."""
    env = settings_env(settings)
    if settings.model is not None:
        p = Path(settings.model).expanduser()
        if p.exists():
            env["ENGRAM_MODEL"] = str(p.resolve())
    return env


def _rotate(path: Path) -> None:
    try:
        if path.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(path, path.with_suffix(path.suffix + ".1"))
    except FileNotFoundError:
        pass


def start_background(settings: Settings, wait: bool = True, timeout: float = 600.0) -> dict[str, Any]:
    """Start the daemon as a detached process (own session, output to log_file(settings)) unless one
    already runs for this data directory. With wait, return once it answers /health (raising
    EngramError with the log's last lines if it exits first). Returns daemon_status(), plus
    "already_running": True when nothing was started. Several commands starting it at once (chats
    autostarting side by side) start one daemon and all wait for it."""
    check_host(settings)
    settings.paths.ensure()
    with _start_lock(settings):  # released once the child holds the run lock or has exited
        current = daemon_status(settings)
        if current is None:
            proc, offset = _spawn(settings)
            locked_by = time.monotonic() + 60  # the child takes the lock before it loads anything
            while proc.poll() is None and running_pid(settings.paths) is None and time.monotonic() < locked_by:
                time.sleep(0.02)
    if current is not None:
        if current.get("ready") or not wait:
            return {**current, "already_running": True}
        return {**_wait_ready(settings, None, timeout, 0), "already_running": True}
    if not wait:
        return {
            "pid": proc.pid,
            "ready": False,
            "state": "starting",
            "log_file": str(log_file(settings)),
            "already_running": False,
        }
    return {**_wait_ready(settings, proc, timeout, offset), "already_running": False}


@contextmanager
def _start_lock(settings: Settings) -> Iterator[None]:
    """Held from "is a daemon running?" until the daemon started holds its own lock, so that two
    commands cannot both see none and both start one."""
    fd = os.open(settings.paths.run_dir / START_LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _spawn(settings: Settings) -> tuple[subprocess.Popen, int]:
    """The daemon detached under its watcher (`python -m engramctl.daemon.watch`, which records a death by a signal
    in words: exits.py), its output appended to the log; returns the watcher's process and the log offset its
    output starts at."""
    logfile = log_file(settings)
    _rotate(logfile)
    exits.forget(settings.paths.run_dir)
    env = child_env(_settings_env(settings))
    cmd = [sys.executable, "-m", "engramctl.daemon.watch"]
    with open(logfile, "ab") as f:
        offset = f.tell()
        f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
        f.flush()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(settings.paths.data_dir),
            start_new_session=True,
            close_fds=True,
        )
    return proc, offset


def _wait_ready(settings: Settings, proc: subprocess.Popen | None, timeout: float, log_offset: int) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            if running_pid(settings.paths) is not None:  # another daemon (`engramctl serve`?) took the lock first
                return _wait_ready(settings, None, deadline - time.monotonic(), log_offset)
            death = exits.Death.of(proc.returncode)
            if death is not None:
                raise EngramError(
                    f"{death.message}. Its log ends: {_log_tail(settings, log_offset)}",
                    hint=f"{death.hint}; full log: {log_file(settings)}",
                )
            raise EngramError(
                f"the daemon exited during startup (exit code {proc.returncode}): {_log_tail(settings, log_offset)}",
                hint=f"full log: {log_file(settings)}",
            )
        status = daemon_status(settings, timeout=1.0)
        if status is not None and status.get("ready"):
            return status
        if status is None and proc is None:  # the daemon we waited for has gone
            raise EngramError(
                f"the daemon exited during startup: {_log_tail(settings, log_offset)}",
                hint=f"full log: {log_file(settings)}",
            )
        if time.monotonic() > deadline:
            raise EngramError(
                f"the daemon did not become ready within {timeout:.0f} s.", hint=f"see its log: {log_file(settings)}"
            )
        time.sleep(0.1)


def _log_tail(settings: Settings, offset: int, lines: int = 3) -> str:
    try:
        with open(log_file(settings), "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    useful = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("---")]
    errors = [ln for ln in useful if "error" in ln.lower()]
    return " | ".join((errors or useful)[-lines:]) or "(no output)"


def stop_background(settings: Settings, timeout: float = 20.0) -> bool:
    """SIGTERM the daemon of this data directory and wait until it has exited (SIGKILL after
    `timeout`). Returns False when no daemon was running."""
    pid = running_pid(settings.paths)
    if pid is None:
        return False
    if pid <= 0:
        raise EngramError(
            "a daemon holds the lock but its pid file is unreadable.", hint=f"check {pid_path(settings.paths)}"
        )
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while running_pid(settings.paths) is not None:
        _reap(pid)
        if time.monotonic() > deadline:
            log.warning("daemon %d did not stop within %.0f s; killing it", pid, timeout)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            end = time.monotonic() + 5
            while running_pid(settings.paths) is not None and time.monotonic() < end:
                _reap(pid)
                time.sleep(0.05)
            break
        time.sleep(0.05)
    _reap(pid)
    return True


def _reap(pid: int) -> None:
    """Collect the exit status if the daemon is our own child (tests, `daemon start` then `stop`)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def last_death(settings: Settings) -> dict[str, Any] | None:
    """How the last daemon of this data directory died by a signal, when it did and none has started since
    ({signal_name, message, hint, at, log, pid}: exits.record)."""
    return exits.last(settings.paths.run_dir)


def daemon_status(settings: Settings, timeout: float = 2.0) -> dict[str, Any] | None:
    """None when no daemon runs for this data directory; else {pid, model, device, dtype, host, port,
    url, uptime_s, started, version, log_file, ready, state ("loading"|"starting"|"running"), and from
    /v1/status: rss_bytes, weights_bytes, n_params, sessions, queue, hot, notices, ...}."""
    pid = running_pid(settings.paths)
    if pid is None:
        return None
    state = read_state(settings) or {}
    if state.get("pid") != pid:
        return {"pid": pid, "ready": False, "state": "starting", "log_file": str(log_file(settings))}
    out: dict[str, Any] = {**state, "ready": False, "state": state.get("state") or "starting"}
    out["uptime_s"] = round(time.time() - float(state.get("started") or time.time()), 3)
    if state.get("state") != "ready":
        return out
    import httpx

    from engramctl.daemon.auth import read_token

    try:
        with httpx.Client(timeout=timeout, verify=tls_for(state["url"])) as http:
            r = http.get(f"{state['url']}/health")
            if r.status_code != 200:
                return out
            out.update(ready=True, state="running")
            token = read_token(settings)
            if token:
                r = http.get(f"{state['url']}/v1/status", headers={"Authorization": f"Bearer {token}"})
                if r.status_code == 200:
                    s = r.json()
                    for key in _STATUS_KEYS:
                        out[key] = s.get(key)
    except httpx.HTTPError:
        pass
    return out
