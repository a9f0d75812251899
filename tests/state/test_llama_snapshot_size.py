"""Invariant 2 on llama.cpp: a pure Mamba2 state has one size whatever its length; a hybrid's grows by
exactly its attention K/V bytes per token (f16 in llama.cpp), in the typed state and in the file."""

from __future__ import annotations

import torch

from tests.snapshot_io import write_state


def _state_at(backend, n_tokens):
    live = backend.new_live()
    backend.prefill(live, torch.randint(3, 512, (n_tokens,), generator=torch.Generator().manual_seed(0)).tolist())
    return backend.capture(live)


def test_pure_mamba2_state_has_the_same_size_at_100_and_2000_tokens(gguf_zoo, load_llama, tmp_path):
    backend = load_llama(gguf_zoo.path("mamba2"), chunk_tokens=512)
    small, large = _state_at(backend, 100), _state_at(backend, 2000)
    assert small.nbytes == large.nbytes > 0
    f_small = write_state(tmp_path / "a.safetensors", small, backend.spec)
    f_large = write_state(tmp_path / "b.safetensors", large, backend.spec)
    assert f_small - small.nbytes - 8 * 100 < 4096  # the rest: token ids (int64) and the header
    assert f_large - large.nbytes - 8 * 2000 < 4096


def test_hybrid_state_grows_by_exactly_its_kv_bytes_per_token(gguf_zoo, load_llama):
    backend = load_llama(gguf_zoo.path("granitemoehybrid"), chunk_tokens=512)
    small, large = _state_at(backend, 100), _state_at(backend, 2000)
    per_token = 2 * 2 * 16 * 2  # one attention layer: keys + values, 2 kv heads x head_dim 16, f16
    assert large.nbytes - small.nbytes == per_token * 1900
    recurrent = [layer.nbytes for layer in small.layers if layer.kind == "recurrent"]
    assert recurrent == [layer.nbytes for layer in large.layers if layer.kind == "recurrent"]
    # llama.cpp's own blob adds 12 bytes of cell metadata per token on top of the K/V
    assert len(backend._get_blob()) == len(_blob_at(backend, 100)) + (per_token + 12) * 1900


def _blob_at(backend, n_tokens):
    live = backend.new_live()
    backend.prefill(live, list(range(3, 3 + n_tokens)))
    return backend._get_blob()
