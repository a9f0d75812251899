"""`ps`, `tiers` and `models` without a daemon, in every output mode."""

from __future__ import annotations

import json


def test_ps_without_daemon(cli, seeded):
    human = cli("ps")
    assert "No daemon is running" in human.stderr
    header = human.stdout.splitlines()[0].split()
    assert header == ["SESSION", "SNAPSHOTS", "TOKENS", "SIZE", "STATE", "IN", "LAST", "USED"]
    assert "demo" in human.stdout and "disk" in human.stdout
    data = cli.json("ps")
    assert data["daemon"] is None
    demo = next(s for s in data["sessions"] if s["name"] == "demo")
    assert demo["n_snapshots"] == 3 and demo["head_tokens"] == 24 and demo["head_tiers"] == ["disk"]
    assert sorted(cli("ps", "-q").stdout.split()) == ["demo", "other"]


def test_sessions(cli, seeded):
    cli("snapshots", "branch", "demo", "fork")
    human = cli("sessions")
    assert human.stdout.splitlines()[0].split()[:4] == ["SESSION", "SNAPSHOTS", "MESSAGES", "TOKENS"]
    assert "BRANCHED FROM" in human.stdout.splitlines()[0]
    rows = {s["name"]: s for s in cli.json("sessions")}
    assert rows["demo"]["n_messages"] == 6 and rows["fork"]["base"] == seeded.sessions["demo"][-1]
    assert sorted(cli("sessions", "-q").stdout.split()) == ["demo", "fork", "other"]


def test_ps_empty(cli):
    r = cli("ps")
    assert r.stdout == "" and "No sessions yet" in r.stderr
    assert cli.json("ps") == {"daemon": None, "sessions": []}


def test_tiers(cli, seeded, monkeypatch):
    monkeypatch.setenv("ENGRAM_TIER_RAM_BYTES", "256MiB")
    human = cli("tiers")
    lines = human.stdout.splitlines()
    assert lines[0].startswith("CPU ")
    table = lines[lines.index(next(ln for ln in lines if ln.startswith("TIER"))):]
    assert table[0].split() == ["TIER", "BUDGET", "USED", "SNAPSHOTS", "RULE"]
    assert table[1].split()[:2] == ["vram", "off"]
    assert "256.0 MiB" in table[2] and "set to 256.0 MiB" in table[2]
    assert "KEEP LAST" in human.stdout
    data = cli.json("tiers")
    names = [t["name"] for t in data["tiers"]]
    assert names == ["vram", "ram", "disk"]
    disk = data["tiers"][2]
    assert disk["snapshots"] == 5 and disk["used_bytes"] > 0
    assert data["retention"]["keep_last"] == 8
    assert "--quiet" not in cli("tiers", "--help").stdout  # a plan has no id to print


def _fake_hub(root, repo, model_type, weights=1000):
    snap = root / f"models--{repo.replace('/', '--')}" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": model_type}))
    (snap / "model.safetensors").write_bytes(b"\0" * weights)
    (root / f"models--{repo.replace('/', '--')}" / "refs").mkdir()
    (root / f"models--{repo.replace('/', '--')}" / "refs" / "main").write_text("abc123")


def test_models(cli, tmp_path, monkeypatch, engram_home):
    hub = tmp_path / "hub"
    _fake_hub(hub, "ibm-granite/granite-4.0-h-350m", "granitemoehybrid", 4096)
    _fake_hub(hub, "state-spaces/mamba2-130m", "mamba2")
    _fake_hub(hub, "some/bert", "bert")  # not a supported family: not listed
    conv = engram_home / "cache" / "models" / "SmolLM2-135M-Instruct.Q4_1-0123456789ab"
    conv.mkdir(parents=True)
    (conv / "config.json").write_text(json.dumps({"model_type": "llama"}))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))

    data = cli.json("models")
    found = {m["model"]: m for m in data["models"]}
    assert found["ibm-granite/granite-4.0-h-350m"]["default"] is True
    assert found["ibm-granite/granite-4.0-h-350m"]["kind"] == "hybrid"
    assert found["ibm-granite/granite-4.0-h-350m"]["nbytes"] == 4096
    assert found["state-spaces/mamba2-130m"]["kind"] == "recurrent"
    assert "some/bert" not in found
    assert found[str(conv)]["source"] == "converted-gguf"
    fams = {f["family"] for f in data["families"]}
    assert {"granitemoehybrid", "mamba2", "nemotron_h", "falcon_h1", "llama"} <= fams

    human = cli("models")
    assert human.stdout.splitlines()[0].split() == ["MODEL", "FAMILY", "KIND", "SIZE", "SOURCE"]
    assert "(default)" in human.stdout and "FAMILY" in human.stdout.split("\n\n")[-1]
    quiet = cli("models", "-q").stdout.split()
    assert "ibm-granite/granite-4.0-h-350m" in quiet and "some/bert" not in quiet


def test_models_none_found(cli, tmp_path, monkeypatch):
    import engramctl.cli.models as models_cli

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(models_cli, "_smollm2", lambda: [])
    r = cli("models")
    assert "No supported model found locally" in r.stderr
    assert r.stdout.splitlines()[0].split() == ["FAMILY", "KIND", "RESUME"]
    assert cli.json("models")["models"] == []
