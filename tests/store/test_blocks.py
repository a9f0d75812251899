"""store/blocks.py and store/reader.py on their own: split, written as the store writes, then read back give
every dtype and layout bitwise (token axis leading or not, a tail of zero tokens), also into a caller's buffers;
block ids chain over the tokens and the bytes; a damaged block or list is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engramctl.errors import SnapshotCorrupt
from engramctl.store import arrays, snapshot_file
from engramctl.store.blocks import KV_BLOCKS, BlockCorrupt, split
from engramctl.store.reader import read_payload
from tests.store.payloads import write_split


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


def _read(tmp_path, own, into=None):
    return read_payload(own, lambda bid: tmp_path / "blocks" / bid, into=into)


def _roundtrip(tmp_path, tensors, meta, ids, block_tokens=16):
    own, blocks = write_split(tmp_path, tensors, meta, ids, block_tokens)
    return _read(tmp_path, own), blocks, own


@pytest.mark.parametrize(
    "kind,dtype", [("numpy", "float16"), ("numpy", "float32"), ("torch", "bfloat16"), ("torch", "float32")]
)
@pytest.mark.parametrize("n", [15, 16, 40, 64])
def test_split_then_read_is_bitwise(kind, dtype, n, tmp_path):
    tensors, meta, ids = _payload(n, kind, dtype)
    (whole, whole_meta), blocks, _ = _roundtrip(tmp_path, tensors, meta, ids)
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


def test_a_payload_is_read_into_the_buffers_a_placer_gives(tmp_path):
    tensors, meta, ids = _payload(40, "numpy", "float16")
    own, _ = write_split(tmp_path, tensors, meta, ids)
    arena = np.zeros(1 << 16, np.uint8)
    seen = {}

    def place(meta_seen, entries):  # the K/V back to back in one buffer, as a backend's blob would hold them
        seen.update(entries)
        out, at = {}, 8
        for name in sorted(k for k in entries if k.endswith(("keys", "values"))):
            _code, shape = entries[name]
            n = int(np.prod(shape)) * 2
            out[name] = arena[at : at + n]
            at += n + 8
        return out

    whole, _ = _read(tmp_path, own, into=place)
    assert seen["layers.0.keys"] == ("F16", (1, 40, 24)) and seen["token_ids"] == ("I64", (40,))
    base = arena.__array_interface__["data"][0]
    for k in tensors:
        assert arrays.equal(whole[k], tensors[k]), k
        inside = base <= whole[k].__array_interface__["data"][0] < base + arena.nbytes
        assert inside == k.endswith(("keys", "values")), k
    assert arena[:8].tolist() == [0] * 8  # what the placer did not give is not written


def test_a_damaged_block_or_block_list_is_refused(tmp_path):
    tensors, meta, ids = _payload(40, "numpy", "float32")
    _, blocks, own = _roundtrip(tmp_path, tensors, meta, ids)
    first, second = tmp_path / "blocks" / blocks[0].id, tmp_path / "blocks" / blocks[1].id
    intact = first.read_bytes()
    raw = bytearray(intact)
    raw[-1] ^= 1
    first.write_bytes(bytes(raw))
    with pytest.raises(BlockCorrupt, match="checksum") as e:
        _read(tmp_path, own)
    assert e.value.block_id == blocks[0].id
    first.write_bytes(second.read_bytes())  # an intact block, but another one
    with pytest.raises(BlockCorrupt, match="another block"):
        _read(tmp_path, own)
    first.write_bytes(intact[: len(intact) // 2])
    with pytest.raises(BlockCorrupt, match="truncated"):
        _read(tmp_path, own)
    first.unlink()
    with pytest.raises(BlockCorrupt, match="missing") as e:
        _read(tmp_path, own)
    assert e.value.block_id == blocks[0].id
    first.write_bytes(intact)
    constant, own_meta, _ = split(tensors, meta, ids, 16)
    bad = tmp_path / "bad.safetensors"
    snapshot_file.write_atomic(
        bad, snapshot_file.encode_parts(constant, {**own_meta, KV_BLOCKS: '{"tokens": "16", "ids": []}'})
    )
    with pytest.raises(SnapshotCorrupt, match="kv_blocks"):
        _read(tmp_path, bad)
    damaged = bytearray(own.read_bytes())
    damaged[-1] ^= 1
    own.write_bytes(bytes(damaged))
    with pytest.raises(SnapshotCorrupt, match="failed its checksum") as e:
        _read(tmp_path, own)
    assert not isinstance(e.value, BlockCorrupt)
