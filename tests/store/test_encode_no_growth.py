"""Encoding snapshots leaves nothing behind (store/snapshot_file.py encode): safetensors.torch.save made a
ctypes POINTER type per tensor byte size, cached by ctypes for the life of the process, so a daemon whose
conversations grow one KV size per token grew without bound (found by tests/daemon/test_soak.py's
four-client soak). Files written the new way read back through safetensors as before."""

from __future__ import annotations

import ctypes
import gc

import torch
from safetensors.torch import load

from engramctl.store import snapshot_file


def test_encoding_many_sizes_adds_no_ctypes_types_and_reads_back():
    gc.collect()
    before = len(ctypes._pointer_type_cache)
    for n in range(1, 300):
        tensors = {
            "keys": torch.randn(1, 2, n, 4),
            "token_ids": torch.arange(n, dtype=torch.int64),
            "bf16": torch.randn(n, dtype=torch.bfloat16),
            "none": torch.zeros(0, 3),
            "flag": torch.tensor(True),
        }
        buf = snapshot_file.encode(tensors, {"n_tokens": str(n)})
    gc.collect()
    assert len(ctypes._pointer_type_cache) == before
    decoded, meta = snapshot_file.decode(buf, source="test")
    assert meta["n_tokens"] == "299"
    for k, t in tensors.items():
        assert decoded[k].dtype == t.dtype and torch.equal(decoded[k], t), k
    raw = load(buf[:])  # still a plain safetensors file
    assert set(raw) == set(tensors)
