"""The backend setting reaches a background daemon, and ps / tiers / daemon status show what serves the
model (backend, weight type, resident weight bytes) as the daemon reports it over HTTP."""

from __future__ import annotations

import pytest

from tests.backends import BACKENDS, both_backends, expected_build, weight_dtype


@pytest.fixture
def daemon(backend, served_model, engram_home, monkeypatch, cli):
    """`engramctl daemon start --backend <backend>` on a tiny model; stopped at the end."""
    from engramctl.daemon.background import stop_background
    from engramctl.settings import load_settings

    monkeypatch.setenv("ENGRAM_PORT", "0")
    model = str(served_model(backend))
    flags = ["--model", model, "--backend", backend, "--dtype", "float32", "--tier-ram-bytes", "64MiB"]
    started = cli("daemon", "start", *flags)
    assert started.stderr.startswith("Daemon started (pid ")
    try:
        yield model
    finally:
        stop_background(load_settings())


@both_backends
def test_backend_flag_reaches_the_daemon_and_is_shown(cli, daemon, backend):
    log = cli("daemon", "logs", "-n", "200").stdout
    assert f"backend {backend}" in log  # the flag went through the env to the daemon's load_model
    # each backend's own truth: transformers holds the weights in float32; llama.cpp keeps the GGUF's type
    wtype = weight_dtype(backend)
    if backend == "llama.cpp":  # --dtype is transformers' and is said to be ignored, not silently dropped
        assert "--dtype float32 applies to transformers; llama.cpp keeps" in log

    ps = cli.json("ps")["daemon"]
    assert (ps["backend"], ps["weight_type"], ps["dtype"]) == (backend, wtype, wtype)
    assert ps["weights_bytes"] > 0
    build = expected_build(backend)  # which llama.cpp build (here the CPU one) or torch computes
    assert ps["build"] == build
    human = cli("ps").stdout.splitlines()
    assert f"BACKEND  {backend}" in human
    assert f"BUILD    {build}" in human
    assert any(ln.startswith("MEMORY ") and wtype in ln for ln in human)
    assert cli.json("daemon", "status")["backend"] == backend

    tiers = cli.json("tiers")
    assert tiers["model"]["backend"] == backend and tiers["model"]["weight_type"] == wtype
    assert tiers["model"]["weights_bytes"] == ps["weights_bytes"]
    ram = next(t for t in tiers["tiers"] if t["name"] == "ram")
    assert ram["budget_bytes"] == 64 * 2**20  # --tier-ram-bytes reached it too
    line = next(ln for ln in cli("tiers").stdout.splitlines() if ln.startswith("MODEL "))
    assert f"{backend}, weights " in line and f"{wtype} on cpu; build {build}" in line
    assert tiers["model"]["build"] == build

    other = next(b for b in BACKENDS if b != backend)
    again = cli("daemon", "start", "--backend", other)
    assert "already running" in again.stderr
    assert f"runs the model on {backend}, not {other}" in again.stderr and f"--backend {other}" in again.stderr
