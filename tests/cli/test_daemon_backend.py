"""The backend setting reaches a background daemon, and ps / tiers / daemon status show what serves the
model (backend, weight type, resident weight bytes) as the daemon reports it over HTTP."""

from __future__ import annotations

import pytest


@pytest.fixture
def daemon(zoo, engram_home, monkeypatch, cli):
    """`engramctl daemon start --backend transformers` on a tiny model; stopped at the end."""
    from engramctl.daemon.runner import stop_background
    from engramctl.settings import load_settings

    monkeypatch.setenv("ENGRAM_PORT", "0")
    model = str(zoo.path("granitemoehybrid"))
    flags = ["--model", model, "--backend", "transformers", "--dtype", "float32", "--tier-ram-bytes", "64MiB"]
    started = cli("daemon", "start", *flags)
    assert started.stderr.startswith("Daemon started (pid ")
    try:
        yield model
    finally:
        stop_background(load_settings())


def test_backend_flag_reaches_the_daemon_and_is_shown(cli, daemon):
    log = cli("daemon", "logs", "-n", "200").stdout
    assert "backend transformers" in log  # the flag went through the env to the daemon's load_model

    ps = cli.json("ps")["daemon"]
    assert (ps["backend"], ps["weight_type"], ps["dtype"]) == ("transformers", "float32", "float32")
    assert ps["weights_bytes"] > 0
    human = cli("ps").stdout.splitlines()
    assert "BACKEND  transformers" in human
    assert any(ln.startswith("MEMORY ") and "float32" in ln for ln in human)
    assert cli.json("daemon", "status")["backend"] == "transformers"

    tiers = cli.json("tiers")
    assert tiers["model"]["backend"] == "transformers" and tiers["model"]["weight_type"] == "float32"
    assert tiers["model"]["weights_bytes"] == ps["weights_bytes"]
    ram = next(t for t in tiers["tiers"] if t["name"] == "ram")
    assert ram["budget_bytes"] == 64 * 2**20  # --tier-ram-bytes reached it too
    line = next(ln for ln in cli("tiers").stdout.splitlines() if ln.startswith("MODEL "))
    assert "transformers, weights " in line and "float32 on cpu" in line

    again = cli("daemon", "start", "--backend", "llama.cpp")
    assert "already running" in again.stderr
    assert "runs the model on transformers, not llama.cpp" in again.stderr and "--backend llama.cpp" in again.stderr
