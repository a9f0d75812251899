"""A snapshot file written in parts (store/snapshot_file.py encode_parts + write_atomic, the store's writer
thread) is the file encode() gives (same checksum, same tensors), still a plain safetensors file, and its
tensor parts are views of the tensors' own memory, not copies of them."""

from __future__ import annotations

import numpy as np
import torch
from safetensors.numpy import load as np_load
from safetensors.torch import load as torch_load

from engramctl.store import arrays, snapshot_file
from engramctl.store.reconcile import checksum_of


def test_a_file_written_in_parts_is_the_encoded_file_and_its_tensors_are_not_copied(tmp_path):
    tensors = {
        "layers.0.ssm": np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32),
        "token_ids": np.arange(37, dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.float16),
        "kv": np.random.default_rng(1).standard_normal((3, 5)).astype(np.float16),
        "flag": np.array(True),
    }
    meta = {"n_tokens": "37", arrays.BACKEND_KEY: "llama.cpp"}  # a llama.cpp state: decoded into numpy
    head, *views = snapshot_file.encode_parts(tensors, meta)
    assert len(views) == len(tensors) and all(isinstance(v, memoryview) for v in views)
    assert sum(v.nbytes for v in views) == sum(t.nbytes for t in tensors.values())
    shared = [k for k, t in tensors.items() if t.nbytes and any(np.shares_memory(t, np.asarray(v)) for v in views)]
    assert sorted(shared) == sorted(k for k, t in tensors.items() if t.nbytes)  # every tensor written from itself
    path = tmp_path / "s.safetensors"
    snapshot_file.write_atomic(path, [head, *views])
    on_disk = path.read_bytes()
    assert on_disk == snapshot_file.encode(tensors, meta) == head + b"".join(bytes(v) for v in views)
    assert checksum_of(head) == checksum_of(on_disk) and checksum_of(head) is not None
    back, got_meta = snapshot_file.read(path)  # checksum and format verified
    assert got_meta["n_tokens"] == "37"
    plain = np_load(on_disk)  # any safetensors reader
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and back[k].shape == t.shape and np.array_equal(back[k], t), k
        assert plain[k].dtype == t.dtype and np.array_equal(plain[k], t), k
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_torch_tensors_of_every_state_dtype_round_trip_through_the_parts(tmp_path):
    tensors = {
        "bf16": torch.randn(3, 7, dtype=torch.bfloat16),
        "f32": torch.randn(2, 2, 5)[:, :, 1:4],  # not contiguous: written from a contiguous copy
        "ids": torch.arange(11, dtype=torch.int64),
        "scalar": torch.tensor(2.5),
        "none": torch.zeros(0, 3),
    }
    parts = snapshot_file.encode_parts(tensors, {"n_tokens": "11"})
    path = tmp_path / "t.safetensors"
    snapshot_file.write_atomic(path, parts)
    back, _ = snapshot_file.read(path)
    plain = torch_load(path.read_bytes())
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t), k
        assert torch.equal(plain[k], t), k


def test_a_file_that_is_not_a_snapshot_says_so_and_a_cut_one_says_it_is_truncated():
    import pytest

    from engramctl.errors import SnapshotCorrupt

    with pytest.raises(SnapshotCorrupt, match="is not a snapshot file"):
        snapshot_file.verify(b"root:x:0:0:root:/root:/bin/bash\n" * 10, "passwd")
    whole = snapshot_file.encode({"x": np.zeros(4, np.float32)}, {"format": snapshot_file.FORMAT})
    with pytest.raises(SnapshotCorrupt, match="is truncated: header says"):
        snapshot_file.verify(whole[:20], "cut")
