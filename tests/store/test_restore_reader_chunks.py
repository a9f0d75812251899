"""store/reader.py reads, hashes and checks a file a chunk at a time (so the hash and the NaN/Inf check run on bytes
still in the cache): chunks cut anywhere in a tensor still give every tensor bitwise, every byte is hashed once
(a flipped byte anywhere fails the checksum), a NaN or Inf in any chunk is found, and damage is reported as damage
before any NaN it may have made."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engramctl.errors import SnapshotCorrupt
from engramctl.store import reader, snapshot_file
from engramctl.store.blocks import BlockCorrupt
from engramctl.store.reader import read_payload
from tests.store.payloads import write_split


def _payload(n: int = 50, seed: int = 0):
    """llama.cpp-like: f16 KV over tokens (in blocks), an f32 recurrent state and int64 ids (in the own file)."""
    g = np.random.default_rng(seed)
    ids = g.integers(3, 500, n).tolist()
    tensors = {
        "layers.0.keys": g.standard_normal((1, n, 37)).astype(np.float16),  # odd rows: cuts fall mid-row
        "layers.0.values": g.standard_normal((1, n, 37)).astype(np.float16),
        "layers.1.recurrent": g.standard_normal((1, 7, 131)).astype(np.float32),
        "token_ids": np.array(ids, np.int64),
    }
    meta = {
        "fingerprint": "fp",
        "n_tokens": str(n),
        "backend": "llama.cpp",
        "token_axes": json.dumps({"layers.0.keys": 1, "layers.0.values": 1}),
    }
    return tensors, meta, ids


def _read(tmp_path, own):
    return read_payload(own, lambda bid: tmp_path / "blocks" / bid, check_values=True)


@pytest.mark.parametrize("chunk", [1000, 4096, 1 << 19])  # 1000: not a multiple of 8, cuts inside values' runs
def test_chunks_anywhere_read_every_tensor_bitwise(chunk, tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "_CHUNK_BYTES", chunk)
    tensors, meta, ids = _payload()
    own, blocks = write_split(tmp_path, tensors, meta, ids)
    assert len(blocks) == 3
    got, _ = _read(tmp_path, own)
    assert got.keys() == tensors.keys()
    for k, t in tensors.items():
        assert got[k].dtype == t.dtype and got[k].shape == t.shape and got[k].tobytes() == t.tobytes(), k


def test_chunks_cover_each_piece_once_in_whole_values(monkeypatch):
    monkeypatch.setattr(reader, "_CHUNK_BYTES", 1000)
    data = {code: np.arange(n, dtype=np.uint8) for code, n in (("F16", 2 * 333), ("F32", 4 * 555), ("I64", 8 * 99))}
    pieces = [(memoryview(a), code, code) for code, a in data.items()]
    pieces.insert(1, (memoryview(np.empty(0, np.uint8)), "F32", "empty"))
    batches = list(reader._chunks(pieces))
    assert all(0 < sum(v.nbytes for v, _, _ in b) <= 1000 for b in batches)
    for code, a in data.items():
        parts = [v for b in batches for v, c, _ in b if c == code and v.nbytes]
        assert all(v.nbytes % snapshot_file.dtype_bytes(code) == 0 for v in parts)
        assert b"".join(bytes(v) for v in parts) == a.tobytes()  # in order, each byte once


@pytest.mark.parametrize("where", ["own", "block"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_non_finite_value_in_any_chunk_is_refused(where, value, tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "_CHUNK_BYTES", 1000)
    tensors, meta, ids = _payload()
    if where == "own":  # the last value of the recurrent state: its last chunk
        tensors["layers.1.recurrent"][0, -1, -1] = value
        name = "layers.1.recurrent"
    else:  # a value in the second block's rows of the values
        tensors["layers.0.values"][0, 20, 30] = value
        name = "layers.0.values"
    own, _ = write_split(tmp_path, tensors, meta, ids)  # written with a valid checksum over the NaN
    with pytest.raises(SnapshotCorrupt, match=f"NaN or Inf values in {name}") as e:
        _read(tmp_path, own)
    assert isinstance(e.value, BlockCorrupt) == (where == "block")


def test_damage_is_reported_as_damage_before_a_nan(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "_CHUNK_BYTES", 1000)
    tensors, meta, ids = _payload()
    tensors["layers.1.recurrent"][0, 0, 0] = np.nan
    own, _ = write_split(tmp_path, tensors, meta, ids)
    raw = bytearray(own.read_bytes())
    raw[-3] ^= 0x40  # a byte in the last chunk, after the NaN's chunk
    own.write_bytes(bytes(raw))
    with pytest.raises(SnapshotCorrupt, match="failed its checksum"):
        _read(tmp_path, own)
