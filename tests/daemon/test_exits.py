"""A daemon that dies by a signal says so in words (daemon/exits.py, daemon/watch.py): `daemon start` and `chat`
(autostart), `serve` in the foreground and `daemon status` afterwards, each with what to do. The daemon is killed on
purpose at its `daemon.loading` crash point (after it holds its lock, before any model loads) with the signal asked
for, as a llama.cpp build for another CPU dies of SIGILL; a child that kills itself with SIGILL stands for the rest."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from engramctl.cli import app
from engramctl.daemon import background, exits, watch
from engramctl.engine.cpu_features import REBUILD_HINT, SIGILL_SENTENCE
from engramctl.errors import EngramError
from engramctl.settings import load_settings
from tests.daemon.conftest import daemon_env


def _settings(home, monkeypatch, crash_signal: str):
    for key, value in daemon_env(home).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ENGRAM_TEST_CRASH_AT", "daemon.loading")
    monkeypatch.setenv("ENGRAM_TEST_CRASH_SIGNAL", crash_signal)
    monkeypatch.setenv("ENGRAM_MODEL", str(home / "never-loaded.gguf"))
    monkeypatch.setenv("ENGRAM_BACKEND", "llama.cpp")
    return load_settings({"port": 0})


@pytest.mark.parametrize("code", [-signal.SIGILL, 128 + signal.SIGILL])
def test_sigill_in_either_form_is_the_cpu_sentence_with_the_fix(code):
    death = exits.Death.of(code)
    assert death.name == "SIGILL" and death.message == f"the daemon died of SIGILL: {SIGILL_SENTENCE}"
    assert death.hint == REBUILD_HINT and "ENGRAM_LLAMA_CPU=portable ./scripts/setup.sh" in death.hint


def test_other_signals_have_their_own_sentence_and_exits_are_not_deaths():
    said = {s: exits.Death.of(-s) for s in (signal.SIGSEGV, signal.SIGBUS, signal.SIGKILL, signal.SIGABRT)}
    assert "segmentation fault" in said[signal.SIGSEGV].message
    assert "bus error" in said[signal.SIGBUS].message
    assert "out-of-memory killer" in said[signal.SIGKILL].message and "dmesg" in said[signal.SIGKILL].hint
    assert len({d.message for d in said.values()}) == 4 and all(SIGILL_SENTENCE not in d.message for d in said.values())
    assert exits.Death.of(0) is None and exits.Death.of(1) is None and exits.Death.of(None) is None


def test_the_watcher_sees_a_child_that_kills_itself_with_sigill(tmp_path):
    code = (
        "import os, signal; print('about to run an instruction this CPU lacks', flush=True); "
        "os.kill(os.getpid(), signal.SIGILL)"
    )
    with open(tmp_path / "log", "wb") as log:
        child = watch.run([sys.executable, "-c", code], {}, stdout=log, stderr=subprocess.STDOUT)
    assert child.returncode == -signal.SIGILL
    assert exits.Death.of(child.returncode).name == "SIGILL"
    assert watch.log_tail(tmp_path / "log", 0) == "about to run an instruction this CPU lacks"


def test_daemon_start_and_status_say_a_sigill_in_words(tmp_path, monkeypatch):
    settings = _settings(tmp_path / "home", monkeypatch, "SIGILL")
    with pytest.raises(EngramError) as e:
        background.start_background(settings, wait=True, timeout=60)
    assert e.value.message.startswith(f"the daemon died of SIGILL: {SIGILL_SENTENCE}")
    assert "exit code" not in e.value.message and e.value.hint.startswith(REBUILD_HINT)
    death = exits.last(settings.paths.run_dir)
    assert death["signal_name"] == "SIGILL" and death["pid"] > 0
    assert oct((settings.paths.run_dir / exits.LAST_EXIT_FILE).stat().st_mode & 0o777) == "0o600"

    runner = CliRunner()
    r = runner.invoke(app, ["daemon", "status"])
    assert r.exit_code == 3
    assert f"the last one (pid {death['pid']}) died of SIGILL: {SIGILL_SENTENCE}" in r.stderr
    assert f"Hint: {REBUILD_HINT}" in r.stderr
    r = runner.invoke(app, ["daemon", "status", "--json"])
    assert json.loads(r.stdout)["last_death"]["signal_name"] == "SIGILL"


def test_chat_that_autostarts_a_daemon_dying_of_sigill_says_why(tmp_path, monkeypatch):
    _settings(tmp_path / "home", monkeypatch, "SIGILL")
    monkeypatch.delenv("ENGRAM_NO_AUTOSTART", raising=False)
    r = CliRunner().invoke(app, ["chat", "--session", "demo", "hello"])
    assert r.exit_code == 1
    assert r.stderr.startswith(f"Error: The daemon died of SIGILL: {SIGILL_SENTENCE}")
    assert f"Hint: {REBUILD_HINT}" in r.stderr


def test_serve_in_the_foreground_says_a_sigill_in_words(tmp_path, monkeypatch):
    _settings(tmp_path / "home", monkeypatch, "SIGILL")
    r = CliRunner().invoke(app, ["serve"])
    assert r.exit_code == 1
    assert r.stderr.splitlines()[-2] == f"Error: The daemon died of SIGILL: {SIGILL_SENTENCE}"
    assert r.stderr.splitlines()[-1] == f"Hint: {REBUILD_HINT}"


def test_a_daemon_killed_by_the_oom_killer_gets_its_sentence_and_its_log(tmp_path, monkeypatch):
    settings = _settings(tmp_path / "home", monkeypatch, "SIGKILL")
    with pytest.raises(EngramError) as e:
        background.start_background(settings, wait=True, timeout=60)
    assert (
        "died of SIGKILL: it was killed (SIGKILL), most often by the kernel's out-of-memory killer" in e.value.message
    )
    assert "Its log ends:" in e.value.message and "dmesg" in e.value.hint
    r = CliRunner().invoke(app, ["daemon", "status"])
    assert "out-of-memory killer" in r.stderr and "Its log ended:" in r.stderr and "never-loaded.gguf" in r.stderr


@pytest.mark.parametrize("backend", ["llama.cpp"], indirect=True)
def test_a_chat_whose_daemon_dies_of_sigill_mid_reply_says_why(served, tmp_path, monkeypatch):
    """The case of a build whose batched kernels fault: the daemon runs, then dies at a prompt. The chat's broken
    stream is told in words of the death its watcher recorded, and `daemon status` says the same afterwards."""
    settings = _settings(tmp_path / "home", monkeypatch, "SIGILL")
    monkeypatch.setenv("ENGRAM_TEST_CRASH_AT", "stream.piece")
    monkeypatch.setenv("ENGRAM_MODEL", str(served))
    background.start_background(load_settings({"port": 0}), wait=True, timeout=120)
    try:
        r = CliRunner().invoke(app, ["chat", "--session", "demo", "-t", "0", "hello there"])
        assert r.exit_code == 3, r.stderr
        assert r.stderr.startswith(f"Error: The daemon died of SIGILL: {SIGILL_SENTENCE}")
        assert f"Hint: {REBUILD_HINT}" in r.stderr
        assert exits.last(settings.paths.run_dir)["signal_name"] == "SIGILL"
    finally:
        background.stop_background(settings)
