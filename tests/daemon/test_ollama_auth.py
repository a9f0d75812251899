"""The Ollama routes keep the token by default; the ollama_no_token setting lets loopback clients that cannot
send one use them (and only them) without it, and it is refused together with allow_remote."""

from __future__ import annotations

import subprocess
import sys

import httpx
import ollama
import pytest

from engramctl.settings import load_settings
from tests.daemon.conftest import ROOT, daemon_env, start_daemon


def test_no_token_for_ollama_routes_from_loopback_only(model_dir, tmp_path):
    d = start_daemon(model_dir, tmp_path / "home", ENGRAM_OLLAMA_NO_TOKEN="1")
    try:
        anonymous = ollama.Client(host=d.url, timeout=60)  # no headers: no token
        assert [m.model for m in anonymous.list().models] == [str(model_dir.resolve())]
        r = anonymous.chat(model="x", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2})
        assert r.done and r.eval_count == 2
        with httpx.Client(base_url=d.url, timeout=30) as c:
            for path in ("/v1/models", "/v1/sessions", "/openapi.json"):  # every other route still needs it
                assert c.get(path).status_code == 401, path
            assert c.post("/v1/completions", json={"prompt": "x"}).status_code == 401
    finally:
        d.stop()


def test_refused_with_allow_remote(engram_home, model_dir, tmp_path):
    from engramctl.daemon.runner import check_host
    from engramctl.errors import UsageError

    with pytest.raises(UsageError, match="allow_remote") as e:
        check_host(load_settings({"host": "127.0.0.1", "ollama_no_token": True, "allow_remote": True}))
    assert "--allow-remote" in e.value.hint
    check_host(load_settings({"host": "127.0.0.1", "ollama_no_token": True}))
    env = daemon_env(tmp_path / "home")
    cmd = [sys.executable, "-m", "engramctl", "daemon", "start", "--model", str(model_dir)]
    proc = subprocess.run(
        [*cmd, "--allow-remote", "--ollama-no-token"],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("Error: ") and "Hint: " in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "home" / "run" / "daemon.json").exists()
