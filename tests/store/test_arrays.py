"""store/arrays.py: numpy arrays and torch tensors make the same snapshot file, byte for byte, and a file
decodes into the kind of the backend that wrote it (numpy for llama.cpp, torch otherwise)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from engramctl.store import arrays, snapshot_file
from engramctl.store.files import SnapshotFiles

META = {"n_tokens": "3", "created": "1.0", "model_id": "m", "fingerprint": "f"}


def _numpy_payload() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "layers.0.keys": rng.standard_normal((1, 3, 8)).astype(np.float16),
        "layers.0.conv": rng.standard_normal((1, 4, 3)).astype(np.float32),
        "layers.1.conv": np.zeros((1, 0), np.float32),  # a layer without one: no elements
        "token_ids": np.array([5, 6, 7], np.int64),
        "last_logits": rng.standard_normal(16).astype(np.float32),
    }


@pytest.mark.parametrize("backend", ["llama.cpp", "transformers"])
def test_numpy_and_torch_payloads_encode_to_the_same_bytes(backend):
    meta = {**META, "backend": backend}
    as_numpy = _numpy_payload()
    as_torch = {k: torch.from_numpy(v.copy()) for k, v in as_numpy.items()}
    a, b = snapshot_file.encode(as_numpy, meta), snapshot_file.encode(as_torch, meta)
    # the same header (safetensors orders metadata keys as its hash map does: compared parsed) and checksum,
    # and the same tensor bytes
    assert snapshot_file.verify(a) == snapshot_file.verify(b)
    assert _data(a) == _data(b) and len(a) == len(b)


def _data(buf: bytes) -> bytes:
    (n,) = struct.unpack("<Q", buf[:8])
    return buf[8 + n :]


def test_a_file_decodes_into_its_writer_backends_kind_bitwise():
    original = _numpy_payload()
    buf = snapshot_file.encode(original, {**META, "backend": "llama.cpp"})
    tensors, _ = snapshot_file.decode(buf)
    assert all(arrays.kind(t) == "numpy" for t in tensors.values())
    assert all(arrays.equal(tensors[k], v) for k, v in original.items())
    for meta in (META, {**META, "backend": "transformers"}):  # no backend key: transformers wrote it
        tensors, _ = snapshot_file.decode(snapshot_file.encode(original, meta))
        assert all(arrays.kind(t) == "torch" for t in tensors.values())
        assert all(np.array_equal(tensors[k].numpy(), v) for k, v in original.items())


def test_bfloat16_which_numpy_lacks_stays_a_tensor():
    t = torch.randn(2, 3).to(torch.bfloat16)
    buf = snapshot_file.encode({"x": t}, {**META, "backend": "llama.cpp"})
    tensors, _ = snapshot_file.decode(buf)
    assert arrays.kind(tensors["x"]) == "torch" and torch.equal(tensors["x"], t)


def test_the_seam_answers_alike_for_both_kinds():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = torch.from_numpy(a.copy())
    for x in (a, t):
        assert arrays.is_array(x) and arrays.dtype_name(x) == "float32" and arrays.shape(x) == (2, 3)
        assert arrays.nbytes(x) == 24 and arrays.is_floating(x) and arrays.all_finite(x)
        assert bytes(arrays.host_bytes(x)) == a.tobytes()
        c = arrays.copy(x)
        c[0, 0] = 9.0
        assert not arrays.equal(c, x) and arrays.equal(arrays.copy(x), x)
        assert arrays.kind(arrays.int64_like(x, [1, 2])) == arrays.kind(x)
    bad = a.copy()
    bad[1, 2] = np.inf
    assert not arrays.all_finite(bad) and not arrays.all_finite(torch.from_numpy(bad))
    for value in (np.inf, -np.inf, np.nan):  # float16 is checked by its exponent bits: each kind of poison
        half = np.ones((3, 2), np.float16)
        half[2, 1] = value
        assert not arrays.all_finite(half) and not arrays.all_finite(half.T)  # strided too
    assert arrays.all_finite(np.array([65504, -65504], np.float16)) and arrays.all_finite(np.zeros(0, np.float16))
    assert not arrays.equal(a, t)  # another kind is another array
    assert not arrays.is_array([1.0]) and arrays.as_kind(a, "torch").data_ptr() == a.ctypes.data  # shared memory


def test_token_ids_read_without_torch_from_either_writer(tmp_path):
    files = SnapshotFiles(tmp_path)
    for sid, backend in (("0" * 32, "llama.cpp"), ("1" * 32, "transformers")):
        files.write(sid, snapshot_file.encode_parts(_numpy_payload(), {**META, "backend": backend}))
        assert files.token_ids(sid) == [5, 6, 7]
