"""Invariant 2: recurrent state has a fixed size; a hybrid adds exactly its attention K/V per token."""

from __future__ import annotations

import torch

from tests.snapshot_io import write_state


def _state_at(backend, n_tokens):
    live = backend.new_live()
    backend.prefill(live, torch.randint(3, 512, (n_tokens,), generator=torch.Generator().manual_seed(0)).tolist())
    return backend.capture(live)


def _kv_bytes_per_token(spec) -> int:
    total = 0
    for layer in spec.layers:
        for name, t in layer.tensors.items():
            if name in ("keys", "values"):
                per = 1
                for d in t.shape_at(1):
                    per *= d
                total += per * torch.empty(0, dtype=getattr(torch, t.dtype)).element_size()
    return total


def test_pure_mamba2_state_has_the_same_size_at_100_and_2000_tokens(zoo, load_backend, tmp_path):
    backend = load_backend(zoo.path("mamba2"), chunk_tokens=256)
    small, large = _state_at(backend, 100), _state_at(backend, 2000)
    assert small.nbytes == large.nbytes > 0
    # the file adds only the token id record (int64 per token) and its header on top of the state
    f_small = write_state(tmp_path / "a.safetensors", small, backend.spec)
    f_large = write_state(tmp_path / "b.safetensors", large, backend.spec)
    assert f_small - small.nbytes - 8 * 100 < 4096
    assert f_large - large.nbytes - 8 * 2000 < 4096


def test_hybrid_state_grows_by_exactly_its_attention_kv_bytes_per_token(zoo, load_backend):
    backend = load_backend(zoo.path("granitemoehybrid"), chunk_tokens=256)
    small, large = _state_at(backend, 100), _state_at(backend, 2000)
    per_token = _kv_bytes_per_token(backend.spec)
    assert per_token == 2 * 2 * 16 * 4  # one attention layer: keys+values, 2 kv heads x head_dim 16, fp32
    assert large.nbytes - small.nbytes == per_token * 1900
    recurrent_only = sum(layer.nbytes for layer in small.layers if layer.kind == "recurrent")
    assert recurrent_only == sum(layer.nbytes for layer in large.layers if layer.kind == "recurrent")
