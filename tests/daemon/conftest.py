"""A real daemon in a process of its own (`python -m engramctl.daemon`, forked from a process that imported what it
imports: tests/daemon/forks.py) on a free loopback port, serving a tiny random granitemoehybrid in float32, and the
helpers the daemon tests share."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.children import Child
from tests.daemon import forks
from tests.workers import THREADS

ROOT = Path(__file__).resolve().parents[2]
FAMILY = "granitemoehybrid"


def daemon_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    if THREADS is not None:  # a pytest-xdist worker's daemons compute on its share of the cores (tests/workers.py)
        env["ENGRAM_THREADS"] = str(THREADS)
    env.update(
        ENGRAM_HOME=str(home),
        ENGRAM_NO_AUTOSTART="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


@dataclass
class Daemon:
    proc: subprocess.Popen | Child
    home: Path
    url: str
    token: str
    log: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def http(self, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def launch(
    model: Path,
    home: Path,
    *args: str,
    nice: int = 0,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    fresh: bool = False,
) -> tuple[subprocess.Popen | Child, Path]:
    """Start the daemon on port 0 without waiting for it: (the process, its log path). The log goes to `log_dir`
    (default: home). In a test session the daemon is forked from a process that imported what it imports
    (tests/daemon/forks.py), unless `fresh` or `nice`: then it is `python -m engramctl.daemon` in a new
    interpreter, as a user starts it."""
    if log_dir is None:
        home.mkdir(parents=True, exist_ok=True)
    log = (log_dir or home) / f"daemon-{time.monotonic_ns()}.log"
    flags = ["--model", str(model), "--port", "0", "--log-level", "warning", *args]
    env = daemon_env(home, **(env or {}))
    if forks.enabled and not (fresh or nice):
        log.write_bytes(b"")  # there once launch returns, as Popen's is
        return forks.fork_daemon(model, flags, env, log, ROOT), log
    cmd = [sys.executable, "-m", "engramctl.daemon", *flags]
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
    return proc, log


def wait_ready(
    proc: subprocess.Popen | Child, log: Path, home: Path, timeout: float, token: str | None = None
) -> tuple[str, str]:
    """Wait until daemon.json says where and /health answers: (url, token). The token is read from the
    home unless the caller set one (ENGRAM_API_KEY)."""
    state_file = home / "run" / "daemon.json"
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        try:
            state = json.loads(state_file.read_text())
            # `nice` execs the daemon, so the pid is the daemon's either way
            if (
                state.get("pid") == proc.pid
                and state.get("state") == "ready"
                and httpx.get(state["url"] + "/health", timeout=2).status_code == 200
            ):
                break
        except (OSError, ValueError, httpx.HTTPError):
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"daemon not ready in {timeout} s:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)
    return state["url"], token or (home / "config" / "token").read_text().strip()


def start_daemon(
    model_dir: Path, home: Path, *args: str, timeout: float = 120.0, fresh: bool = False, **env: str
) -> Daemon:
    """Start the daemon in float32 on port 0 (launch: forked unless `fresh`) and wait until daemon.json says where
    and /health answers (a fresh transformers daemon takes ~9 s of CPU to get there: far longer on a machine the
    other pytest worker and its daemons load too)."""
    proc, log = launch(model_dir, home, "--dtype", "float32", *args, env=env, fresh=fresh)
    url, token = wait_ready(proc, log, home, timeout, env.get("ENGRAM_API_KEY"))
    return Daemon(proc, home, url, token, log)


@pytest.fixture(scope="module")
def model_dir(zoo) -> Path:
    return zoo.path(FAMILY)


@pytest.fixture(scope="module")
def served(backend, served_model) -> Path:
    """What `--model` names for the module's backend (tests.backends): the model directory or its GGUF."""
    return served_model(backend)


@pytest.fixture(scope="module")
def reference_backend(backend, tiny_engine):
    """The same model on the same backend loaded in the test process, for reference replies computed by a
    full prefill."""
    return tiny_engine(backend, "reference").backend


def greedy_reference(backend, messages: list[dict], max_tokens: int) -> str:
    """What a stateless server answers: render, tokenize, full prefill, greedy decode (the engine's own
    generation loop, so the text is shaped the same way)."""
    from engramctl.engine.engine import Engine
    from engramctl.engine.sampling import SamplingParams

    engine = Engine(backend, backend.tokenizer)
    tok = backend.tokenizer
    live = backend.new_live()
    backend.prefill(live, tok.encode(tok.render(messages, add_generation_prompt=True)))
    return "".join(engine.generate(live, SamplingParams(temperature=0.0, max_tokens=max_tokens)))
