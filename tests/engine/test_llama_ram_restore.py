"""A state held in memory restores from the blob it lies in: a payload read into place (store/reader.py into
llama_place.place) is found there once, then known by its arrays (SequencePool.original) and loaded as it lies,
with from_payload's checks done once per payload (codec.Checked); anything that changed the payload's arrays
since is checked and laid out again. Restored bits are the captured ones."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from engramctl.errors import SnapshotMismatch
from engramctl.state.codec import Checked, from_payload
from engramctl.store.reader import read_payload
from tests.snapshot_io import write_state


@pytest.fixture(scope="module")
def granite(gguf_zoo, load_llama):
    return load_llama(gguf_zoo.path("granitemoehybrid"), chunk_tokens=16)


def _conv(tensors) -> str:
    return next(k for k in tensors if k.endswith(".conv"))


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _bytes(state) -> dict[str, bytes]:
    return {f"{i}.{k}": t.tobytes() for i, layer in enumerate(state.layers) for k, t in layer.tensors().items()}


def _read(granite, tmp_path, n_tokens: int = 40):
    live = granite.new_live()
    granite.prefill(live, _ids(n_tokens, 1))
    captured = granite.capture(live)
    granite.release(live)
    path = tmp_path / "s.safetensors"
    write_state(path, captured, granite.spec)
    return _bytes(captured), read_payload(path, lambda bid: tmp_path / bid, into=granite.place_state)


def test_a_payload_read_into_place_restores_from_its_blob_found_once(granite, tmp_path):
    want, (tensors, meta) = _read(granite, tmp_path)
    checked = Checked()
    pool = granite._pool
    first = from_payload(tensors, meta, granite.spec, check_values=False, checked=checked)
    assert checked.hits == 0 and pool.original(first) is None  # not known yet: found in place by inject
    live = granite.inject(first)
    granite.release(live)
    for n in (1, 2):  # the payload restored again from RAM: no checks, no search, the same blob
        again = from_payload(tensors, meta, granite.spec, check_values=False, checked=checked)
        assert checked.hits == n
        blob, _serial = pool.original(again)
        base = tensors[_conv(tensors)]
        while base.base is not None:
            base = base.base
        assert np.shares_memory(np.frombuffer(blob, np.uint8), base)  # the buffer the reader filled
        live = granite.inject(again)
        assert _bytes(granite.capture(live)) == want  # bitwise
        granite.release(live)


def test_a_payload_restored_again_gives_the_state_built_once_while_the_payload_lives(granite, tmp_path):
    want, (tensors, meta) = _read(granite, tmp_path)
    checked = Checked()
    first = from_payload(tensors, meta, granite.spec, check_values=False, checked=checked)
    again = from_payload(tensors, meta, granite.spec, check_values=False, checked=checked)
    assert again is first and checked.hits == 1  # not built again
    live = granite.inject(again)
    assert _bytes(granite.capture(live)) == want  # bitwise
    granite.release(live)
    state = weakref.ref(first)
    del first, again, live
    gc.collect()
    assert state() is not None  # kept while the payload is (a memory tier holds it)
    del tensors
    gc.collect()
    assert state() is None and not checked._seen  # the payload went: the state built from it too


def test_a_payload_whose_arrays_changed_is_checked_and_laid_out_again(granite, tmp_path):
    want, (tensors, meta) = _read(granite, tmp_path)
    checked = Checked()
    granite.release(granite.inject(from_payload(tensors, meta, granite.spec, check_values=False, checked=checked)))

    conv = _conv(tensors)
    copied = dict(tensors)
    copied[conv] = tensors[conv].copy()  # same bytes, another array: not the blob's
    state = from_payload(copied, meta, granite.spec, check_values=False, checked=checked)
    assert checked.hits == 0
    assert granite._pool.original(state) is None
    live = granite.inject(state)  # serialized from its tensors: still the same bits
    assert _bytes(granite.capture(live)) == want
    granite.release(live)

    wrong = dict(copied)
    wrong[conv] = tensors[conv][:, :1]  # a view of the same memory, another shape
    with pytest.raises(SnapshotMismatch, match=conv):
        from_payload(wrong, meta, granite.spec, check_values=False, checked=checked)
    for hits in (0, 1):  # the copy shares its token ids array: the first payload is checked again, then known
        assert from_payload(tensors, meta, granite.spec, check_values=False, checked=checked).n_tokens == 40
        assert checked.hits == hits
    other = {**meta, "fingerprint": "0" * 16}  # the metadata read is compared too
    with pytest.raises(SnapshotMismatch, match="fingerprint"):
        from_payload(tensors, other, granite.spec, check_values=False, checked=checked)
