"""The two servers `engramctl bench serve` measures, as processes a client talks to over loopback HTTP.

    daemon = Server.engramctl(gguf, threads=2, home=tmp)          # `engramctl serve`, its own ENGRAM_HOME
    peer = Server.llama_server(binary, gguf, threads=2, ctx=8192, slots=4)
    with daemon: ...  daemon.url, daemon.headers, daemon.rss_bytes(), daemon.cpu_s(); daemon.restart()
    daemon.settle(client)                                          # its snapshot files written, untimed

Both get the same GGUF, the same thread count and (the peer) the daemon's context length. The daemon runs
exactly as a user starts it (`python -m engramctl serve`, the same settings a user would give through
ENGRAM_* variables); only ENGRAM_HOME is a throwaway directory, so its snapshots and run files never
mix with the user's.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engramctl.daemon.exits import Death
from engramctl.errors import EngramError

START_TIMEOUT_S = 300.0  # a 350M model loads in seconds; the first daemon start may convert nothing else
SETTLE_TIMEOUT_S = 120.0  # a round of 8 turns owes 16 snapshot files (~9 ms of writer CPU each on SmolLM2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str  # "engramctl" | "llama-server" | runner.EMPTY_TWIN
    command: list[str]
    env: dict[str, str]
    health: str  # the path that answers 200 once the model is loaded
    token: str | None
    log_path: Path
    port: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @classmethod
    def engramctl(cls, gguf: Path, *, threads: int, home: Path, name: str = "engramctl") -> "Server":
        token = secrets.token_hex(16)
        env = {"ENGRAM_HOME": str(home), "ENGRAM_API_KEY": token, "ENGRAM_THREADS": str(threads)}
        env |= {"ENGRAM_MODEL": str(gguf), "ENGRAM_BACKEND": "llama.cpp", "ENGRAM_NO_AUTOSTART": "1"}
        cmd = [sys.executable, "-m", "engramctl", "serve", "--port", "{port}"]
        return cls(name, cmd, env, "/v1/status", token, home / "daemon.log")

    @classmethod
    def llama_server(
        cls, binary: Path, gguf: Path, *, threads: int, ctx: int, slots: int, logs: Path, gpu: bool = False
    ) -> "Server":
        # As a user runs it: its defaults but for what must match (threads, context, parallel slots, every
        # layer on the GPU where ours runs there); flash attention on, as our backend runs it.
        cmd = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", "{port}", "-t", str(threads)]
        cmd += ["-tb", str(threads), "-c", str(ctx), "-np", str(slots), "-fa", "on", "--no-webui"]
        cmd += ["-ngl", "999"] if gpu else []
        # its libraries first (the build's RUNPATH names the temporary build folder), then the machine's (CUDA's)
        env = {
            "LD_LIBRARY_PATH": os.pathsep.join(p for p in (str(binary.parent), os.environ.get("LD_LIBRARY_PATH")) if p)
        }
        return cls("llama-server", cmd, env, "/health", None, logs / f"llama-server-np{slots}.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def start(self) -> "Server":
        self.port = free_port()
        cmd = [part.replace("{port}", str(self.port)) for part in self.command]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, env={**os.environ, **self.env}, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise self._ended()
                try:
                    if client.get(self.url + self.health, headers=self.headers).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        self.stop()
        raise EngramError(f"{self.name} did not answer within {START_TIMEOUT_S:.0f} s; see {self.log_path}")

    def _ended(self) -> EngramError:
        """Why the server's process ended by itself: a death by a signal in words (a llama-server built for other
        CPU features dies of SIGILL at its first long prompt), else its exit status; its log named."""
        death = Death.of(self.proc.returncode, who=self.name) if self.proc else None
        if death is None:
            return EngramError(
                f"{self.name} exited with status {self.proc and self.proc.returncode}; see {self.log_path}"
            )
        return EngramError(f"{death.message}; see {self.log_path}", hint=death.hint or None)

    def stop(self) -> None:
        """SIGTERM (the daemon flushes its snapshot writes), then SIGKILL after 30 s. A server that died by a signal
        before it was stopped raises that death (the measurement it was part of is void)."""
        if self.proc is None:
            return
        if self.proc.poll() is not None and Death.of(self.proc.returncode) is not None:
            error = self._ended()
            self.proc = None
            raise error
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> "Server":
        self.stop()
        return self.start()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _processes(self) -> list:
        """The server's process and its descendants: `engramctl serve` is the daemon's watcher (daemon/watch.py)
        with the daemon as its child, and a user runs both, so both are measured."""
        import psutil

        if self.proc is None:
            raise EngramError(f"{self.name} is not running.")
        top = psutil.Process(self.proc.pid)
        return [top, *top.children(recursive=True)]

    def rss_bytes(self) -> int:
        return sum(int(p.memory_info().rss) for p in self._processes())

    def settle(self, client: httpx.Client, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
        """Wait, untimed, until the daemon has written the snapshot files it owes: its writer thread works on
        after a reply ends, and that CPU would otherwise fall into the next measurement, the other server's
        half the time (ABBA). llama-server writes nothing."""
        if self.name != "engramctl":
            return
        deadline = time.monotonic() + timeout_s
        while client.get(self.url + "/v1/status", headers=self.headers).json().get("pending_writes"):
            if time.monotonic() > deadline:
                raise EngramError(f"the daemon still had snapshot writes pending after {timeout_s:.0f} s")
            time.sleep(0.05)

    def written_bytes(self) -> int:
        """Bytes the server's processes have caused to be written to storage (Linux /proc/<pid>/io write_bytes)."""
        return sum(int(p.io_counters().write_bytes) for p in self._processes())

    def cpu_s(self) -> float:
        """CPU seconds the server's processes have used (all their threads)."""
        return sum(t.user + t.system for t in (p.cpu_times() for p in self._processes()))
