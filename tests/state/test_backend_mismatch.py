"""Invariant 3 across backends: a snapshot records the backend and state format that wrote it, and one
from another backend or another format version is refused with a message naming what differs (the
daemon then re-prefills the transcript). A snapshot without the keys is a transformers one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engramctl.errors import SnapshotMismatch
from engramctl.state.codec import BACKEND, STATE_FORMAT, from_payload, to_payload
from tests.snapshot_io import read_state, write_state
from engramctl.store import snapshot_file
from engramctl.store import arrays


def _state(backend, n=12):
    live = backend.new_live()
    backend.prefill(live, torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(3)).tolist())
    return backend.capture(live)


def test_llama_snapshot_records_backend_and_format_and_round_trips(gguf_zoo, load_llama, tmp_path):
    backend = load_llama(gguf_zoo.path("falcon_h1"))
    state = _state(backend)
    write_state(tmp_path / "s.safetensors", state, backend.spec)
    meta = snapshot_file.read_metadata(tmp_path / "s.safetensors")
    assert meta[BACKEND] == "llama.cpp" and meta[STATE_FORMAT] == backend.spec.state_format
    assert meta["backend_version"] == backend.library_version
    back = read_state(tmp_path / "s.safetensors", backend.spec)
    assert back.token_ids == state.token_ids and arrays.equal(back.last_logits, state.last_logits)


def test_a_transformers_snapshot_is_refused_by_llama_cpp_and_back(gguf_zoo, load_llama, load_backend, zoo, tmp_path):
    lc = load_llama(gguf_zoo.path("granitemoehybrid"))
    hf = load_backend(zoo.path("granitemoehybrid"))
    write_state(tmp_path / "hf.safetensors", _state(hf), hf.spec)
    write_state(tmp_path / "lc.safetensors", _state(lc), lc.spec)
    with pytest.raises(
        SnapshotMismatch, match="written by the transformers backend; the loaded model runs on llama.cpp"
    ):
        read_state(tmp_path / "hf.safetensors", lc.spec)
    with pytest.raises(
        SnapshotMismatch, match="written by the llama.cpp backend; the loaded model runs on transformers"
    ):
        read_state(tmp_path / "lc.safetensors", hf.spec)


def test_an_older_snapshot_without_backend_keys_counts_as_transformers(load_backend, zoo, gguf_zoo, load_llama):
    hf = load_backend(zoo.path("mamba2"))
    tensors, meta = to_payload(_state(hf), hf.spec, {})
    del meta[BACKEND], meta[STATE_FORMAT]
    assert from_payload(tensors, meta, hf.spec).n_tokens == 12  # still readable by transformers
    lc = load_llama(gguf_zoo.path("mamba2"))
    with pytest.raises(SnapshotMismatch, match="transformers backend"):
        from_payload(tensors, meta, lc.spec)


def test_another_state_format_version_is_refused_naming_both(gguf_zoo, load_llama):
    lc = load_llama(gguf_zoo.path("mamba2"))
    tensors, meta = to_payload(_state(lc), lc.spec, {})
    newer = dataclasses.replace(lc.spec, state_format="llama.cpp-seq4-typed1", backend_version="0.4.0")
    with pytest.raises(SnapshotMismatch, match=r"'llama.cpp-seq3-typed1'.*'llama.cpp-seq4-typed1' \(version 0.4.0\)"):
        from_payload(tensors, meta, newer)
