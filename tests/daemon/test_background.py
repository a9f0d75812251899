"""Starting the background daemon from several commands at once (chats autostarting side by side): one
daemon starts and every caller gets it; a daemon that dies while others wait for it fails them
promptly instead of leaving them waiting out their timeout."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from engramctl.daemon import background
from engramctl.daemon.rundir import RunLock, log_file
from engramctl.errors import EngramError
from engramctl.settings import load_settings
from tests.daemon.conftest import daemon_env


def _settings(home, monkeypatch, model):
    for key, value in daemon_env(home).items():
        monkeypatch.setenv(key, value)
    return load_settings({"model": str(model), "backend": "llama.cpp", "port": 0})


def _start_three(settings) -> list:
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(background.start_background, settings, True, 90) for _ in range(3)]
        return [f.exception() or f.result() for f in futures]


@pytest.mark.parametrize("backend", ["llama.cpp"], indirect=True)
def test_three_starts_at_once_start_one_daemon_and_all_get_it(served, tmp_path, monkeypatch):
    settings = _settings(tmp_path / "home", monkeypatch, served)
    try:
        results = _start_three(settings)
        assert all(isinstance(r, dict) and r["ready"] for r in results), results
        assert len({r["pid"] for r in results}) == 1
        assert sorted(r["already_running"] for r in results) == [False, True, True]
        assert "already running" not in log_file(settings).read_text()  # no second daemon was even spawned
    finally:
        background.stop_background(settings)


def test_a_daemon_that_dies_starting_fails_whoever_waits_for_it_promptly(tmp_path, monkeypatch):
    settings = _settings(tmp_path / "home", monkeypatch, tmp_path / "unused.gguf")
    settings.paths.ensure()
    starting = RunLock(settings)  # what a daemon holds from its first moment, before it loads anything
    starting.acquire()
    with ThreadPoolExecutor(1) as pool:
        t0 = time.monotonic()
        waiter = pool.submit(background.start_background, settings, True, 30)
        time.sleep(1.0)
        assert not waiter.done()  # it waits for the daemon starting, rather than starting a second
        starting.release()  # that daemon dies before it is ready
        with pytest.raises(EngramError, match="exited during startup"):
            waiter.result()
        assert time.monotonic() - t0 < 10  # not the 30 s it would wait for a daemon that has gone
    assert background.daemon_status(settings) is None
