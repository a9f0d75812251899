"""Running the daemon in the foreground (`serve`: `engramctl serve`, and `python -m engramctl.daemon`,
which the background start runs; its flags are `add_setting_arguments`), on a loopback address unless
allowed otherwise (`check_host`). Starting, stopping and asking after a background daemon is
background.py's; the run directory's files (pid lock, daemon.json, log) are rundir.py's.
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from engramctl import __version__
from engramctl.daemon.auth import check_open_routes
from engramctl.daemon.rundir import RunLock, log_file, state_path, url_for, write_state
from engramctl.errors import EngramError, UsageError
from engramctl.settings import SPECS, Settings
from engramctl.store.crashpoints import crash_point

log = logging.getLogger("engramctl.daemon")

GRACEFUL_S = 5.0  # how long open streams get to end after SIGTERM/SIGINT


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
    # Starting imports torch and transformers and builds the model: objects that live as long as the process, which
    # the collector would walk again and again while they are made (~1 s of the tiny test model's ~9 s of CPU to
    # ready, for ~8 MB of cycles left until a full collection). It collects again once the model is loaded.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _serve(settings, reuse, log_level, loaded=gc.enable if collecting else lambda: None)
    finally:
        if collecting:
            gc.enable()


def _serve(settings: Settings, reuse: bool, log_level: str, loaded: Callable[[], None]) -> int:
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
        # the log's last line before a death in native code (a SIGILL of a build for another CPU) says what ran
        log.info("engramctl %s (pid %d): loading %s", __version__, os.getpid(), settings.model or "the default model")
        crash_point("daemon.loading")
        app = create_app(settings, reuse=reuse)
        loaded()
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
            # httptools and uvloop (dependencies; "auto" falls back to h11 and asyncio without them): each
            # streamed token costs the event-loop thread less CPU, and on a 2-core machine that CPU is taken
            # from the decode threads (h11 + asyncio: ~0.45 ms CPU a token, one stream 1.10x llama-server's
            # ms/token on SmolLM2; 1.00x with these: docs/history/benchmarks-2026.md, "Figures after httptools").
            # httptools refuses a request that breaks HTTP's grammar (a control byte in a header) with
            # uvicorn's plain-text 400 before any route runs.
            http="auto",
            loop="auto",
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


# -- the flags of `python -m engramctl.daemon` ------------------------------------------------------
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
