"""Running the daemon: in the foreground (`serve`), or in the background (`start_background`,
`stop_background`, `daemon_status`, `log_file`), for `engramctl serve` / `engramctl daemon ...`.
The run directory's files (pid lock, daemon.json, log) are rundir.py's.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from engramctl import __version__
from engramctl.daemon.auth import check_open_routes
from engramctl.daemon.model import load_model
from engramctl.daemon.rundir import (
    RunLock,
    daemon_url,
    log_file,
    pid_path,
    read_state,
    running_pid,
    state_path,
    url_for,
    write_state,
)
from engramctl.errors import EngramError, UsageError
from engramctl.settings import SPECS, Settings, settings_env

log = logging.getLogger("engramctl.daemon")

LOG_ROTATE_BYTES = 16 * 2**20
GRACEFUL_S = 5.0  # how long open streams get to end after SIGTERM/SIGINT
# What daemon_status() takes from /v1/status.
_STATUS_KEYS = """uptime_s rss_bytes weights_bytes backend weight_type n_params sessions queue turns hot pending_writes
family context_length started notices serving""".split()


# -- host checks ---------------------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return False
        return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_host(settings: Settings) -> None:
    """Loopback only, unless settings.allow_remote; then warn. The Ollama routes' no-token setting
    refuses allow_remote."""
    check_open_routes(settings)
    if is_loopback(settings.host):
        return
    if not settings.allow_remote:
        raise UsageError(
            f"refusing to listen on {settings.host}: it is reachable from other machines.",
            hint="pass --allow-remote (or ENGRAM_ALLOW_REMOTE=1) to do it anyway; "
            "every route but /health needs the token",
        )
    log.warning("listening on %s: reachable from other machines (token auth only, no TLS)", settings.host)


def _bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as e:
        raise UsageError(f"cannot resolve host {host!r}: {e}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise EngramError(
            f"cannot listen on {host}:{port}: {e.strerror or e}.",
            hint="another program (or daemon) uses that port; pick another with --port",
        ) from None
    return sock


# -- foreground -----------------------------------------------------------------------------------------
def _setup_logging(level: str) -> None:
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level.upper())


def serve(settings: Settings, *, reuse: bool = True, log_level: str = "info") -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT, logging to stderr. On a signal: stop
    accepting, cancel the generation in flight (its partial reply is recorded), flush pending
    snapshot writes, exit within a few seconds. Returns the exit status (0).
    Raises EngramError when it cannot start (port taken, another daemon, no model)."""
    import uvicorn

    from engramctl.daemon.app import create_app

    _setup_logging(log_level)
    check_host(settings)
    settings.paths.ensure()
    lock = RunLock(settings)
    lock.acquire()
    daemon = sock = None
    try:
        sock = _bind(settings.host, settings.port)
        port = sock.getsockname()[1]
        state = {
            "pid": os.getpid(),
            "host": settings.host,
            "port": port,
            "url": url_for(settings.host, port),
            "model": settings.model,
            "backend": settings.backend,
            "device": settings.device,
            "dtype": settings.dtype,
            "started": time.time(),
            "version": __version__,
            "log_file": str(log_file(settings)),
            "state": "loading",
        }
        write_state(settings, state)
        app = create_app(settings, reuse=reuse)
        daemon = app.state.daemon
        info = daemon.engine.info
        state.update(model=info.model_id, backend=info.backend, weight_type=info.weight_type or info.dtype)
        state.update(device=info.device, dtype=info.dtype, state="ready")
        write_state(settings, state)
        log.info(
            "engramctl %s serving %s on %s (pid %d); token: %s",
            __version__,
            info.model_id,
            state["url"],
            os.getpid(),
            "ENGRAM_API_KEY" if settings.api_key else settings.paths.config_dir / "token",
        )
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=True,
            lifespan="on",
            http="h11",
            ws="websockets-sansio",  # /v1/agent/ws
            timeout_graceful_shutdown=int(GRACEFUL_S),
            server_header=False,
        )
        server = _make_server(config, daemon)
        server.run(sockets=[sock])
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if daemon is not None:
            daemon.close()
        if sock is not None:
            sock.close()
        try:
            state_path(settings).unlink(missing_ok=True)
        finally:
            lock.release()
        log.info("daemon stopped")


def _make_server(config, daemon):
    """A uvicorn.Server that cancels the generation in flight on the first signal (so open streams end
    at once instead of holding the shutdown) and exits normally instead of re-raising the signal."""
    import asyncio

    import uvicorn

    class _Server(uvicorn.Server):
        _loop = None

        async def serve(self, sockets=None):
            self._loop = asyncio.get_running_loop()
            await super().serve(sockets=sockets)

        def handle_exit(self, sig, frame):
            if not self.should_exit:
                log.info("received %s: stopping", signal.Signals(sig).name)
                if self._loop is not None:  # a signal handler must not take locks: do it on the loop
                    self._loop.call_soon_threadsafe(daemon.begin_shutdown)
            super().handle_exit(sig, frame)
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    return _Server(config)


# -- background -----------------------------------------------------------------------------------------
def _settings_env(settings: Settings) -> dict[str, str]:
    """Every daemon setting as its ENGRAM_* variable (flags and config.toml included), with a local
    model path made absolute: the daemon runs in the data directory."""
    env = settings_env(settings)
    if settings.model is not None:
        p = Path(settings.model).expanduser()
        if p.exists():
            env["ENGRAM_MODEL"] = str(p.resolve())
    return env


def add_setting_arguments(parser: argparse.ArgumentParser) -> None:
    """The daemon's flags (`python -m engramctl.daemon --help`): one per daemon setting, named, explained
    and checked as in engramctl.settings. Values stay text here so load_settings words every error."""
    for s in SPECS:
        if not (s.daemon and s.flag):
            continue
        help = f"{s.help} (default {s.shown_default}; env {s.env})"
        names = [s.flag] + ([s.short] if s.short else [])
        if s.kind == "bool":
            parser.add_argument(*names, dest=s.name, action="store_const", const="1", default=None, help=help)
            if s.off_flag:
                parser.add_argument(s.off_flag, dest=s.name, action="store_const", const="0", help=argparse.SUPPRESS)
        else:
            metavar = s.metavar or ("{" + ",".join(s.choices) + "}" if s.choices else None)
            parser.add_argument(*names, dest=s.name, metavar=metavar, default=None, help=help)


def setting_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags in `args` (add_setting_arguments), for load_settings."""
    return {s.name: getattr(args, s.name) for s in SPECS if getattr(args, s.name, None) is not None}


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
    "already_running": True when nothing was started."""
    current = daemon_status(settings)
    if current is not None:
        if current.get("ready") or not wait:
            return {**current, "already_running": True}
        return {**_wait_ready(settings, None, timeout, 0), "already_running": True}
    check_host(settings)
    settings.paths.ensure()
    logfile = log_file(settings)
    _rotate(logfile)
    env = {**os.environ, **_settings_env(settings)}
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "engramctl.daemon"]
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
    if not wait:
        return {
            "pid": proc.pid,
            "ready": False,
            "state": "starting",
            "log_file": str(logfile),
            "already_running": False,
        }
    return {**_wait_ready(settings, proc, timeout, offset), "already_running": False}


def _wait_ready(settings: Settings, proc: subprocess.Popen | None, timeout: float, log_offset: int) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise EngramError(
                f"the daemon exited during startup (exit code {proc.returncode}): {_log_tail(settings, log_offset)}",
                hint=f"full log: {log_file(settings)}",
            )
        status = daemon_status(settings, timeout=1.0)
        if status is not None and status.get("ready"):
            return status
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
    pid = running_pid(settings)
    if pid is None:
        return False
    if pid <= 0:
        raise EngramError("a daemon holds the lock but its pid file is unreadable.", hint=f"check {pid_path(settings)}")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while running_pid(settings) is not None:
        _reap(pid)
        if time.monotonic() > deadline:
            log.warning("daemon %d did not stop within %.0f s; killing it", pid, timeout)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            end = time.monotonic() + 5
            while running_pid(settings) is not None and time.monotonic() < end:
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


def daemon_status(settings: Settings, timeout: float = 2.0) -> dict[str, Any] | None:
    """None when no daemon runs for this data directory; else {pid, model, device, dtype, host, port,
    url, uptime_s, started, version, log_file, ready, state ("loading"|"starting"|"running"), and from
    /v1/status: rss_bytes, weights_bytes, n_params, sessions, queue, hot, notices, ...}."""
    pid = running_pid(settings)
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
        r = httpx.get(f"{state['url']}/health", timeout=timeout)
        if r.status_code != 200:
            return out
        out.update(ready=True, state="running")
        token = read_token(settings)
        if token:
            r = httpx.get(f"{state['url']}/v1/status", headers={"Authorization": f"Bearer {token}"}, timeout=timeout)
            if r.status_code == 200:
                s = r.json()
                for key in _STATUS_KEYS:
                    out[key] = s.get(key)
    except httpx.HTTPError:
        pass
    return out


__all__ = [
    "serve",
    "start_background",
    "stop_background",
    "daemon_status",
    "log_file",
    "daemon_url",
    "running_pid",
    "load_model",
    "check_host",
    "is_loopback",
]
