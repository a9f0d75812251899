"""Invariant 3: a snapshot refuses to load into another model, dtype or format, or when damaged,
with a message saying what is wrong, and the model is left untouched."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from engramctl.engine.fingerprint import model_fingerprint
from engramctl.errors import SnapshotCorrupt, SnapshotMismatch
from tests.snapshot_io import read_state, write_state
from engramctl.store import snapshot_file

IDS = list(range(3, 43))


@pytest.fixture(scope="module")
def written(zoo, load_backend, tmp_path_factory):
    backend = load_backend(zoo.path("granitemoehybrid"))
    live = backend.new_live()
    backend.prefill(live, IDS)
    path = tmp_path_factory.mktemp("verify") / "snap.safetensors"
    write_state(path, backend.capture(live), backend.spec)
    return backend, path


def _untouched(backend):
    """Fingerprint of the weights and the logits of a fixed prompt: both must survive a failed load."""
    live = backend.new_live()
    return model_fingerprint(backend.model, backend.model.config.to_dict()), backend.prefill(live, IDS).clone()


def _expect(exc, backend, path, spec=None, match=None):
    before = _untouched(backend)
    with pytest.raises(exc, match=match):
        read_state(path, spec or backend.spec)
    after = _untouched(backend)
    assert before[0] == after[0] and torch.equal(before[1], after[1])


def test_intact_snapshot_loads(written):
    backend, path = written
    assert read_state(path, backend.spec).token_ids == tuple(IDS)


def test_different_weights_are_refused(written, zoo, load_backend):
    backend, path = written
    other = load_backend(zoo.path("granitemoehybrid", seed=1))
    assert other.spec.fingerprint != backend.spec.fingerprint
    _expect(SnapshotMismatch, other, path, match="fingerprint")


def test_other_family_is_refused(written, zoo, load_backend):
    _, path = written
    other = load_backend(zoo.path("bamba"))
    _expect(SnapshotMismatch, other, path, match="fingerprint|layout")


def test_another_dtype_is_refused(written, zoo, load_backend):
    _, path = written
    bf16 = load_backend(zoo.path("granitemoehybrid"), dtype=torch.bfloat16)
    assert bf16.spec.fingerprint == written[0].spec.fingerprint  # same weights: the dtype is what differs
    _expect(SnapshotMismatch, bf16, path, match="float32 model; the loaded model runs bfloat16")


def test_wrong_format_version_is_refused(written, tmp_path, monkeypatch):
    backend, path = written
    tensors, meta = snapshot_file.read(path)
    monkeypatch.setattr(snapshot_file, "FORMAT_VERSION", "0")
    old = tmp_path / "old.safetensors"
    snapshot_file.write(old, tensors, meta)
    monkeypatch.undo()
    _expect(SnapshotMismatch, backend, old, match="format version '0'")


def test_truncated_file_is_refused(written, tmp_path):
    backend, path = written
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size - 100])
    _expect(SnapshotCorrupt, backend, cut, match="truncated")
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(path.read_bytes()[:5])
    _expect(SnapshotCorrupt, backend, tiny, match="truncated")


@pytest.mark.parametrize("where", ["data", "header_value"])
def test_one_flipped_byte_is_refused(written, tmp_path, where):
    backend, path = written
    buf = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", buf[:8])
    if where == "data":
        pos = 8 + n + (len(buf) - 8 - n) // 2
    else:  # a digit of the token count inside the header metadata
        pos = buf.index(b'"n_tokens":"40"') + len('"n_tokens":"')
    buf[pos] ^= 0x01
    bad = tmp_path / "flipped.safetensors"
    bad.write_bytes(bytes(buf))
    _expect(SnapshotCorrupt, backend, bad, match="checksum")


def test_nan_state_is_refused_on_save_and_on_load(written, tmp_path):
    backend, path = written
    tensors, meta = snapshot_file.read(path)
    state = read_state(path, backend.spec)
    poisoned = next(layer for layer in state.layers if layer.kind == "recurrent")
    poisoned.recurrent[0, 0, 0, 0] = float("nan")
    with pytest.raises(SnapshotCorrupt, match="NaN or Inf"):
        write_state(tmp_path / "nan.safetensors", state, backend.spec)
    key = next(k for k in tensors if k.endswith(".recurrent"))
    tensors[key][0, 0, 0, 0] = float("inf")
    snapshot_file.write(tmp_path / "inf.safetensors", tensors, meta)  # bypasses the save-side check
    _expect(SnapshotCorrupt, backend, tmp_path / "inf.safetensors", match="NaN or Inf")


def test_shape_mismatch_names_the_tensor(written, tmp_path):
    backend, path = written
    tensors, meta = snapshot_file.read(path)
    key = next(k for k in tensors if k.endswith(".conv"))
    tensors[key] = tensors[key][..., :-1].contiguous()
    snapshot_file.write(tmp_path / "shape.safetensors", tensors, meta)
    _expect(SnapshotMismatch, backend, tmp_path / "shape.safetensors", match=key.replace(".", r"\."))


def test_header_is_plain_safetensors_with_the_documented_metadata(written):
    _, path = written
    meta = snapshot_file.read_metadata(path)
    for key in (
        "format_version",
        "model_id",
        "fingerprint",
        "dtype",
        "layout",
        "dtypes",
        "n_tokens",
        "created",
        "checksum",
    ):
        assert meta[key], key
    assert json.loads(meta["layout"]) == ["recurrent", "attention", "recurrent", "recurrent"]
    assert json.loads(meta["dtypes"])["layers.1.keys"] == "float32"
