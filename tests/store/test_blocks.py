"""store/blocks.py on its own: split and join give back every dtype and layout bitwise (token axis leading or
not, a tail of zero tokens), block ids chain over the tokens and the bytes, a damaged list is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engramctl.errors import SnapshotCorrupt
from engramctl.store import arrays, snapshot_file
from engramctl.store.blocks import KV_BLOCKS, BlockCorrupt, join, split


def _payload(n: int, kind: str, dtype: str, seed: int = 0):
    g = np.random.default_rng(seed)
    ids = g.integers(3, 500, n).tolist()
    if kind == "numpy":  # llama.cpp's layout: (1, tokens, row)
        kv = {
            f"layers.{i}.{k}": g.standard_normal((1, n, 24)).astype(dtype) for i in (0, 2) for k in ("keys", "values")
        }
        rest = {
            "layers.1.recurrent": g.standard_normal((1, 4, 8)).astype("float32"),
            "token_ids": np.array(ids, np.int64),
        }
        axes = {k: 1 for k in kv}
    else:  # transformers': (1, kv_heads, tokens, head_dim)
        t = torch.Generator().manual_seed(seed)
        kv = {
            f"layers.{i}.{k}": torch.randn(1, 3, n, 8, generator=t).to(getattr(torch, dtype))
            for i in (0, 2)
            for k in ("keys", "values")
        }
        rest = {
            "layers.1.recurrent": torch.randn(1, 4, 8, generator=t),
            "token_ids": torch.tensor(ids, dtype=torch.int64),
        }
        axes = {k: 2 for k in kv}
    meta = {"fingerprint": "fp", "n_tokens": str(n), "token_axes": json.dumps(axes)}
    if kind == "numpy":
        meta["backend"] = "llama.cpp"  # what the store decodes numpy arrays for (arrays.kind_of)
    return {**kv, **rest}, meta, ids


def _roundtrip(tensors, meta, ids, block_tokens=16):
    constant, own_meta, blocks = split(tensors, meta, ids, block_tokens)
    files = {b.id: b"".join(bytes(p) for p in b.parts("fp")) for b in blocks}
    # the constant part as the store writes and reads it
    decoded = snapshot_file.decode(snapshot_file.encode(constant, own_meta))
    return join(*decoded, files.__getitem__, "test"), blocks, files, decoded


@pytest.mark.parametrize(
    "kind,dtype", [("numpy", "float16"), ("numpy", "float32"), ("torch", "bfloat16"), ("torch", "float32")]
)
@pytest.mark.parametrize("n", [15, 16, 40, 64])
def test_split_then_join_is_bitwise(kind, dtype, n):
    tensors, meta, ids = _payload(n, kind, dtype)
    (whole, whole_meta), blocks, _, _ = _roundtrip(tensors, meta, ids)
    assert len(blocks) == n // 16
    assert whole.keys() == tensors.keys() and KV_BLOCKS not in whole_meta
    for k in tensors:
        assert arrays.kind(whole[k]) == arrays.kind(tensors[k]) and arrays.equal(whole[k], tensors[k]), k


def test_block_ids_chain_over_tokens_and_bytes():
    tensors, meta, ids = _payload(48, "numpy", "float16")
    _, _, a = split(tensors, meta, ids, 16)
    _, _, same = split({k: v.copy() for k, v in tensors.items()}, meta, ids, 16)
    assert [b.id for b in a] == [b.id for b in same] and len({b.id for b in a}) == 3
    changed = {k: v.copy() for k, v in tensors.items()}
    changed["layers.0.keys"][0, 20, 0] += 1  # other bytes in block 1: blocks 1 and 2 are others, block 0 is not
    _, _, b = split(changed, meta, ids, 16)
    assert a[0].id == b[0].id and a[1].id != b[1].id and a[2].id != b[2].id
    _, _, c = split(tensors, {**meta, "fingerprint": "another"}, ids, 16)
    assert not {x.id for x in a} & {x.id for x in c}


def test_a_payload_without_token_axes_or_with_wrong_ones_is_kept_whole():
    tensors, meta, ids = _payload(40, "numpy", "float32")
    for bad in ({k: v for k, v in meta.items() if k != "token_axes"}, {**meta, "token_axes": '{"layers.0.keys": 2}'}):
        constant, own_meta, blocks = split(tensors, bad, ids, 16)
        assert blocks == [] and constant is tensors and KV_BLOCKS not in own_meta


def test_a_damaged_block_or_block_list_is_refused():
    tensors, meta, ids = _payload(40, "numpy", "float32")
    _, blocks, files, (constant, own_meta) = _roundtrip(tensors, meta, ids)
    first = blocks[0].id
    damaged = dict(files)
    raw = bytearray(damaged[first])
    raw[-1] ^= 1
    damaged[first] = bytes(raw)
    with pytest.raises(BlockCorrupt, match="checksum") as e:
        join(constant, own_meta, damaged.__getitem__, "test")
    assert e.value.block_id == first
    swapped = {**files, first: files[blocks[1].id]}  # an intact block, but another one
    with pytest.raises(BlockCorrupt, match="another block"):
        join(constant, own_meta, swapped.__getitem__, "test")
    with pytest.raises(SnapshotCorrupt, match="kv_blocks"):
        join(constant, {**own_meta, KV_BLOCKS: '{"tokens": "16", "ids": []}'}, files.__getitem__, "test")
