"""A stock OpenAI client (no `session`) holds a 6-turn conversation; the daemon is SIGKILLed and started
again; the resent history is restored from disk instead of recomputed, and the greedy reply equals a
full prefill's. The daemon runs in the background through daemon/background.py (start/status/stop)."""

from __future__ import annotations

import os
import signal
import time

import httpx
import openai
import pytest

from engramctl.daemon import background
from engramctl.daemon.rundir import log_file
from engramctl.settings import load_settings
from tests.backends import both_backends, weight_dtype
from tests.daemon.conftest import daemon_env, greedy_reference

TURNS = 6
MAX_TOKENS = 8

pytestmark = both_backends


@pytest.fixture
def bg_settings(served, backend, tmp_path, monkeypatch):
    home = tmp_path / "bg-home"
    for key, value in daemon_env(home).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ENGRAM_DTYPE", "float32")
    settings = load_settings({"model": str(served), "backend": backend, "port": 0})
    yield settings
    background.stop_background(settings)


def _client(settings, status) -> openai.OpenAI:
    from engramctl.daemon.auth import read_token

    return openai.OpenAI(base_url=status["url"] + "/v1", api_key=read_token(settings), max_retries=0, timeout=60)


def test_history_resent_after_sigkill_is_restored_not_recomputed(bg_settings, reference_backend, backend):
    assert background.daemon_status(bg_settings) is None
    st = background.start_background(bg_settings, wait=True, timeout=90)
    assert st["ready"] and st["pid"] != os.getpid() and st["port"] > 0 and not st["already_running"]
    assert st["device"] == "cpu" and st["dtype"] == weight_dtype(backend) and st["uptime_s"] >= 0
    assert background.start_background(bg_settings)["already_running"]
    client = _client(bg_settings, st)

    messages = [{"role": "system", "content": "You are a terse assistant."}]
    for k in range(TURNS):
        messages.append({"role": "user", "content": f"Question number {k + 1}: tell me about layer {k}."})
        r = client.chat.completions.create(model="default", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
        if k:  # every turn after the first reuses the previous turns
            assert r.usage.prompt_tokens_details.cached_tokens > 0
        messages.append({"role": "assistant", "content": r.choices[0].message.content})

    url, headers = st["url"], {"Authorization": f"Bearer {client.api_key}"}
    deadline = time.monotonic() + 20
    while not all(s["durable"] for s in httpx.get(url + "/list_snapshots", headers=headers).json()["snapshots"]):
        assert time.monotonic() < deadline, "snapshots never became durable"
        time.sleep(0.05)

    os.kill(st["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while background.daemon_status(bg_settings) is not None:
        background._reap(st["pid"])
        assert time.monotonic() < deadline
        time.sleep(0.05)

    st2 = background.start_background(bg_settings, wait=True, timeout=90)  # stale pid/state files are ignored
    assert st2["pid"] != st["pid"] and not st2["already_running"]
    client = _client(bg_settings, st2)
    messages.append({"role": "user", "content": "And finally, a summary?"})
    r = client.chat.completions.create(model="default", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    ext = r.model_extra["engram"]
    cached, prompt = r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens
    # at least everything up to the last reply comes from disk (the prompt snapshot of turn 6)
    last_turn = len(reference_backend.tokenizer.encode(messages[-2]["content"] + messages[-1]["content"])) + 12
    print(f"cached {cached} of {prompt} prompt tokens after the restart")
    assert cached >= prompt - last_turn and cached / prompt > 0.8, (cached, prompt)
    assert ext["resumed"] and ext["tier"] == "disk" and ext["restored_tokens"] == cached
    assert r.choices[0].message.content == greedy_reference(reference_backend, messages, MAX_TOKENS)

    assert background.stop_background(bg_settings) is True
    assert background.daemon_status(bg_settings) is None and background.stop_background(bg_settings) is False
    assert "Traceback" not in log_file(bg_settings).read_text()
