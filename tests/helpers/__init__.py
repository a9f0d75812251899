"""What many test modules share, written once: a chat turn over HTTP and the daemon's app in-process.

    chat(h, "s", "hi")                        one greedy turn (an httpx.Client or a TestClient): the response
    with served_app(engine, max_queue=2) as c: the daemon's app on a tiny engine, a TestClient with the token
        c.daemon                              its Daemon (store, service, worker)
    daemon = module_daemon("ollama-home")     a test module's fixture: a real daemon process for the module
    clear_store_env(monkeypatch)              no ENGRAM_TIER_*/KEEP_LAST/SESSION_TTL_S from the environment
    store, tiers = open_planned(settings)     a Store and the TierPlanner it follows, as the daemon opens them
    got = in_fresh_process("tests.engine._resume_child", work, jobs)   a child restores snapshots: its tensors

A real daemon over real HTTP: tests.daemon.conftest (a subprocess) and tests.helpers.inprocess (a thread).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import pytest

TOKEN = "test-token"

# What a developer's environment may set that would change a store's budgets or retention under a test.
STORE_ENV = (
    "ENGRAM_TIER_VRAM_BYTES",
    "ENGRAM_TIER_RAM_BYTES",
    "ENGRAM_TIER_DISK_BYTES",
    "ENGRAM_KEEP_LAST",
    "ENGRAM_SESSION_TTL_S",
)


def clear_store_env(monkeypatch: Any) -> None:
    """Unset STORE_ENV for this test, so budgets and retention come from the test's own settings."""
    for var in STORE_ENV:
        monkeypatch.delenv(var, raising=False)


def open_planned(settings: Any, hardware: Any = None, **open_kw: Any) -> tuple[Any, Any]:
    """Store.open(settings, **open_kw) and the TierPlanner whose plan it keeps within (from `hardware`, else
    this machine's), as the daemon opens them; the caller closes the store."""
    from engramctl.store.store import Store
    from engramctl.tiers.planner import TierPlanner

    store = Store.open(settings, **open_kw)
    try:
        return store, TierPlanner.start(settings, store.retention, hardware=hardware)
    except BaseException:
        store.close()
        raise


def in_fresh_process(module: str, work: Any, jobs: list[dict]) -> dict:
    """Run `python -m module JOBS OUT` from the repository root (a fresh process: nothing of this one's
    state) on `jobs` written to work/jobs.json; the tensors it saved to work/out.safetensors."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    (work / "jobs.json").write_text(json.dumps(jobs))
    out = work / "out.safetensors"
    proc = subprocess.run(
        [sys.executable, "-m", module, str(work / "jobs.json"), str(out)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_file(out)


def chat(h: Any, session: str | None, content: str | list[dict], max_tokens: int = 4, **extra: Any) -> dict:
    """One greedy, non-streamed turn through POST /v1/chat/completions; fails the test on a non-200.
    `content`: the user's message, or the whole message list; `session` None sends none (a stateless
    client; `conversation_id=` in `extra` names it the Engram way)."""
    messages = [{"role": "user", "content": content}] if isinstance(content, str) else list(content)
    body = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
    if session is not None:
        body["session"] = session
    r = h.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


@contextmanager
def served_app(engine: Any, token: str = TOKEN, **settings: Any) -> Iterator[Any]:
    """The daemon's app (create_app) on `engine` over a fresh store in ENGRAM_HOME, as a Starlette
    TestClient that sends the token; `.daemon` is the app's Daemon. Closed (store flushed) at the end."""
    from fastapi.testclient import TestClient

    from engramctl.daemon.app import create_app
    from engramctl.settings import load_settings
    from engramctl.store.store import Store

    s = load_settings({"api_key": token, **settings})
    s.paths.ensure()
    app = create_app(s, engine=engine, store=Store.open(s))
    client = TestClient(app, raise_server_exceptions=False, headers={"Authorization": f"Bearer {token}"})
    client.daemon = app.state.daemon
    try:
        yield client
    finally:
        app.state.daemon.close()


def module_daemon(home: str, *args: str, backend_flag: bool = False):
    """A module-scoped `daemon` fixture: a real daemon process (tests.daemon.conftest.start_daemon) serving
    the module's `served` model from a fresh ENGRAM_HOME named `home`, with `args` as its flags (and
    `--backend <the module's backend>` with backend_flag), stopped after the module's last test."""

    @pytest.fixture(scope="module")
    def daemon(backend, served, tmp_path_factory):
        from tests.daemon.conftest import start_daemon

        flags = (*args, "--backend", backend) if backend_flag else args
        d = start_daemon(served, tmp_path_factory.mktemp(home), *flags)
        yield d
        d.stop()

    return daemon
