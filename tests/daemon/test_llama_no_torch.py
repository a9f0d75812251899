"""A daemon serving a GGUF on the llama.cpp backend never imports torch (nor transformers) through a whole
session: a streamed turn, a second turn on the kept state, an Engram-API save and restore, `engramctl
snapshots ls`, and, after a restart, a snapshot restored from disk into a new session. torch alone is
~200 MiB of resident memory (issue 18); llama.cpp's states and logits are numpy arrays.

The daemon runs as a user starts it (`python -m engramctl.daemon`), wrapped only so that, as it exits,
it writes the names of every module it imported; the same wrapper around a transformers daemon shows torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from tests.daemon.conftest import ROOT, Daemon, daemon_env, wait_ready

# runs the daemon's own entry point; at exit (SIGTERM: uvicorn shuts down and returns) writes sys.modules
PROBE = """
import atexit, json, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = "engramctl.daemon"
runpy.run_module("engramctl.daemon", run_name="__main__", alter_sys=True)
"""


def _start(model: Path, home: Path, modules: Path, backend: str) -> Daemon:
    log = home / f"daemon-{time.monotonic_ns()}.log"
    home.mkdir(parents=True, exist_ok=True)
    args = ["--model", str(model), "--backend", backend, "--port", "0", "--log-level", "warning"]
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-c", PROBE, str(modules), *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=daemon_env(home),
            cwd=str(ROOT),
        )
    url, token = wait_ready(proc, log, home, 120.0)
    return Daemon(proc, home, url, token, log)


def _modules_at_exit(d: Daemon, modules: Path) -> set[str]:
    assert d.stop() == 0, d.log_text()
    return set(json.loads(modules.read_text()))


def _stream(oai: openai.OpenAI, session: str, text: str) -> dict:
    """One streamed greedy turn; its `engram` object (merged over the chunks) and its text."""
    engram, pieces = {}, []
    for chunk in oai.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": text}],
        max_tokens=8,
        temperature=0,
        stream=True,
        extra_body={"session": session},
    ):
        engram.update((chunk.model_extra or {}).get("engram") or {})
        pieces += [c.delta.content or "" for c in chunk.choices]
    return {**engram, "text": "".join(pieces)}


def test_llama_cpp_daemon_serves_a_whole_session_without_torch(served_model, tmp_path, monkeypatch):
    from tests.cli.conftest import Runner

    gguf = served_model("llama.cpp")
    home = tmp_path / "home"
    monkeypatch.setenv("ENGRAM_HOME", str(home))  # `engramctl snapshots ls` asks this home's daemon
    first, second = tmp_path / "modules-1.json", tmp_path / "modules-2.json"

    d = _start(gguf, home, first, "llama.cpp")
    try:
        oai = openai.OpenAI(base_url=d.url + "/v1", api_key=d.token, max_retries=0, timeout=120)
        one = _stream(oai, "demo", "Hello there.")
        assert one["snapshot_id"] and one["text"]
        two = _stream(oai, "demo", "And then?")
        assert two["resumed"] is True and two["cached_tokens"] > 0  # the kept state, not a re-prefill
        with d.http() as h:
            saved = h.post("/save_snapshot", json={"conversation_id": "demo", "snapshot_id": "mark"})
            assert saved.status_code == 200 and saved.json()["success"] is True, saved.text
            restored = h.post("/restore_snapshot", json={"conversation_id": "demo", "snapshot_id": "mark"})
            assert restored.status_code == 200 and restored.json()["success"] is True, restored.text
        listed = Runner()("snapshots", "ls", "--json")
        assert two["snapshot_id"] in listed.stdout
    finally:
        modules = _modules_at_exit(d, first)
    assert "engramctl.engine.llama_backend" in modules and "numpy" in modules  # the dump is this daemon's
    assert not {"torch", "transformers"} & modules, sorted(
        m for m in modules if m.split(".")[0] in ("torch", "transformers")
    )

    d = _start(gguf, home, second, "llama.cpp")  # a fresh process: every snapshot is on disk only
    try:
        with d.http() as h:
            deadline = time.monotonic() + 60
            while not (prefetched := h.get("/v1/status").json()["prefetched"])["done"]:
                assert time.monotonic() < deadline, prefetched
                time.sleep(0.05)
            # the prefetch read demo's head from its files and checked it (daemon/prefetch.py), as a turn's load would
            assert prefetched["states"] >= 1 and prefetched["failed"] == 0, prefetched
            branched = h.post("/branch_snapshot", json={"snapshot_id": two["snapshot_id"], "new_session": "fork"})
            assert branched.status_code == 200, branched.text
        oai = openai.OpenAI(base_url=d.url + "/v1", api_key=d.token, max_retries=0, timeout=120)
        three = _stream(oai, "fork", "Go on.")
        assert three["resumed"] is True and three["tier"] == "ram", three
    finally:
        modules = _modules_at_exit(d, second)
    assert "engramctl.engine.llama_backend" in modules
    assert not {"torch", "transformers"} & modules


def test_the_same_probe_sees_torch_in_a_transformers_daemon(served_model, tmp_path):
    """The check above can fail: the transformers backend's daemon, dumped the same way, holds torch."""
    modules = tmp_path / "modules.json"
    d = _start(served_model("transformers"), tmp_path / "home", modules, "transformers")
    assert "torch" in _modules_at_exit(d, modules)


@pytest.fixture(autouse=True)
def _no_stray_env(monkeypatch):
    monkeypatch.delenv("ENGRAM_API_KEY", raising=False)
