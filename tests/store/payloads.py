"""Snapshot payloads for the store tests, shaped like a small hybrid model's state.

The one place that builds test payloads (also imported by the crash-test child process), so it can
later be swapped for engine-captured state. Layout: recurrent, attention, recurrent, like a
Mamba2/attention hybrid: conv (1, conv_dim, d_conv), recurrent (1, heads, head_dim, d_state),
keys/values (1, kv_heads, tokens, head_dim), token_ids (n,) int64, last_logits (vocab,) float32.
"""

from __future__ import annotations

import torch

VOCAB = 512
FINGERPRINT = "test-fingerprint-0001"


def make_payload(
    n_tokens: int,
    seed: int = 0,
    *,
    token_ids: list[int] | None = None,
    fingerprint: str = FINGERPRINT,
    width: int = 1,
    blocks: bool = False,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """`width` scales the fixed-size (recurrent) part, to make payloads bigger for I/O tests. `blocks`: the
    metadata names the keys' and values' token axis, as state/codec.to_payload does, so the store keeps
    their full blocks of tokens in shared KV blocks."""
    g = torch.Generator().manual_seed(seed)
    if token_ids is None:
        token_ids = torch.randint(3, VOCAB, (n_tokens,), generator=g).tolist()
    n = len(token_ids)
    conv_dim, d_conv, heads, head_dim, d_state, kv_heads = 96 * width, 4, 4 * width, 16, 8, 2
    tensors = {
        "layers.0.conv": torch.randn(1, conv_dim, d_conv, generator=g),
        "layers.0.recurrent": torch.randn(1, heads, head_dim, d_state, generator=g),
        "layers.1.keys": torch.randn(1, kv_heads, n, head_dim, generator=g),
        "layers.1.values": torch.randn(1, kv_heads, n, head_dim, generator=g),
        "layers.2.conv": torch.randn(1, conv_dim, d_conv, generator=g),
        "layers.2.recurrent": torch.randn(1, heads, head_dim, d_state, generator=g),
        "token_ids": torch.tensor(token_ids, dtype=torch.int64),
        "last_logits": torch.randn(VOCAB, generator=g),
    }
    meta = {
        "n_tokens": str(n),
        "fingerprint": fingerprint,
        "model_id": "test/tiny-hybrid",
        "dtype": "float32",
        "layout": '["recurrent", "attention", "recurrent"]',
        "text": f"text of {n} tokens (seed {seed})",
    }
    if blocks:
        meta["token_axes"] = '{"layers.1.keys":2,"layers.1.values":2}'
    return tensors, meta


def prefix_of(payload, n: int, seed: int = 0):
    """The payload of the same conversation after its first `n` tokens: the same KV for them (what a model's
    cache holds), the rest of the state drawn anew from `seed`."""
    tensors, meta = payload
    out = make_payload(n, seed, token_ids=tensors["token_ids"][:n].tolist(), blocks="token_axes" in meta)
    out[0]["layers.1.keys"] = tensors["layers.1.keys"][:, :, :n].contiguous()
    out[0]["layers.1.values"] = tensors["layers.1.values"][:, :, :n].contiguous()
    return out


def nbytes(payload) -> int:
    return sum(t.numel() * t.element_size() for t in payload[0].values())


def same_payload(a, b) -> bool:
    ta, tb = a[0], b[0]
    return ta.keys() == tb.keys() and all(torch.equal(ta[k].cpu(), tb[k].cpu()) for k in ta)


def write_split(tmp_path, tensors, meta, ids, block_tokens=16):
    """The payload as the store writes it: its own file and a file per block, in tmp_path."""
    from engramctl.store import snapshot_file
    from engramctl.store.blocks import split

    constant, own_meta, blocks = split(tensors, meta, ids, block_tokens)
    (tmp_path / "blocks").mkdir(exist_ok=True)
    for b in blocks:
        snapshot_file.write_atomic(tmp_path / "blocks" / b.id, b.parts("fp"))
    own = tmp_path / "own.safetensors"
    snapshot_file.write_atomic(own, snapshot_file.encode_parts(constant, own_meta))
    return own, blocks
