"""The daemon's app served over real HTTP from a thread of the test process, registered in the run
directory exactly as `engramctl daemon start` registers a daemon (the pid lock, daemon.json), so the
CLI and engramctl.client find it and talk to it as to any daemon. Reuses a tiny engine loaded once per
session (tests/conftest.py tiny_engine) instead of loading a model in a new process.

    with InProcessDaemon(engine) as d:      # in this test's ENGRAM_HOME
        cli("snapshots", "rm", ...)         # goes through d over HTTP
        d.store.flush()
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any


class InProcessDaemon:
    def __init__(self, engine: Any, **settings: Any):
        self.engine, self.overrides = engine, settings

    def __enter__(self) -> "InProcessDaemon":
        import uvicorn

        from engramctl.daemon.app import create_app
        from engramctl.daemon.rundir import RunLock, url_for, write_state
        from engramctl.settings import load_settings
        from engramctl.store.store import Store

        self.settings = load_settings(self.overrides)
        self.settings.paths.ensure()
        self.lock = RunLock(self.settings)
        self.lock.acquire()
        self.app = create_app(self.settings, engine=self.engine, store=Store.open(self.settings))
        self.daemon = self.app.state.daemon
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        port = self.sock.getsockname()[1]
        self.url = url_for("127.0.0.1", port)
        config = uvicorn.Config(self.app, log_config=None, lifespan="off", http="h11", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                self.__exit__()
                raise RuntimeError("the in-process daemon did not start")
            time.sleep(0.01)
        info = self.engine.info
        state = {"pid": os.getpid(), "host": "127.0.0.1", "port": port, "url": self.url, "model": info.model_id}
        state.update(backend=info.backend, device=info.device, dtype=info.dtype, started=time.time(), state="ready")
        write_state(self.settings, state)
        return self

    @property
    def store(self) -> Any:
        return self.daemon.store

    def clients(self, timeout: float = 120) -> tuple[Any, Any]:
        """The official openai client and an httpx client on this daemon, with its token (close the second)."""
        import httpx
        import openai

        token = self.daemon.token
        oai = openai.OpenAI(base_url=self.url + "/v1", api_key=token, max_retries=0, timeout=timeout)
        return oai, httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)

    def __exit__(self, *exc: Any) -> None:
        from engramctl.daemon.rundir import state_path

        self.server.should_exit = True
        self.thread.join(30)
        self.daemon.close()
        self.sock.close()
        state_path(self.settings).unlink(missing_ok=True)
        self.lock.release()
