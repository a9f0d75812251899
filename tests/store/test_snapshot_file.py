"""A snapshot file written in parts (store/snapshot_file.py encode_parts + write_atomic, the store's writer
thread) is the file encode() gives (same checksum, same tensors), and its tensor part is a view of the
serialized bytes, not a second copy of them."""

from __future__ import annotations

import numpy as np

from engramctl.store import arrays, snapshot_file
from engramctl.store.reconcile import checksum_of


def test_a_file_written_in_parts_is_the_encoded_file_and_its_tensors_are_not_copied(tmp_path):
    tensors = {
        "layers.0.ssm": np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32),
        "token_ids": np.arange(37, dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.float16),
    }
    meta = {"n_tokens": "37", arrays.BACKEND_KEY: "llama.cpp"}  # a llama.cpp state: decoded into numpy
    head, data = snapshot_file.encode_parts(tensors, meta)
    assert isinstance(data, memoryview) and data.nbytes == sum(t.nbytes for t in tensors.values())
    path = tmp_path / "s.safetensors"
    snapshot_file.write_atomic(path, (head, data))
    on_disk = path.read_bytes()
    assert on_disk == head + bytes(data)
    # the same file as encode()'s (safetensors orders header keys its own way each call: the checksum is over
    # the canonical header and the data), and the store records its checksum from the header part alone
    assert checksum_of(head) == checksum_of(on_disk) == checksum_of(snapshot_file.encode(tensors, meta))
    assert checksum_of(head) is not None
    back, got_meta = snapshot_file.read(path)  # checksum and format verified
    assert got_meta["n_tokens"] == "37"
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and np.array_equal(back[k], t), k
    assert oct(path.stat().st_mode & 0o777) == "0o600"
