"""The llama.cpp backend's own contract: Lives swap through one context without changing results,
release() frees, prefill chunks and cancels between them, and an injected state is what was captured."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from engramctl.errors import Cancelled, EngramError
from engramctl.store import arrays


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def granite(gguf_zoo, load_llama):
    return load_llama(gguf_zoo.path("granitemoehybrid"), chunk_tokens=16)


def _alone(backend, prompt: list[int], steps: int) -> list[torch.Tensor]:
    live = backend.new_live()
    out = [backend.prefill(live, prompt).copy()]
    for _ in range(steps):
        out.append(backend.decode(live, int(out[-1].argmax())).copy())
    backend.release(live)
    return out


def test_interleaved_lives_give_what_each_gives_alone(granite):
    pa, pb = _ids(37, 1), _ids(21, 2)
    ref_a, ref_b = _alone(granite, pa, 6), _alone(granite, pb, 6)
    a, b = granite.new_live(), granite.new_live()
    got_a, got_b = [granite.prefill(a, pa).copy()], [granite.prefill(b, pb).copy()]
    for _ in range(6):  # every step swaps the state held in llama.cpp's one sequence
        got_a.append(granite.decode(a, int(got_a[-1].argmax())).copy())
        got_b.append(granite.decode(b, int(got_b[-1].argmax())).copy())
    assert all(arrays.equal(x, y) for x, y in zip(got_a, ref_a))
    assert all(arrays.equal(x, y) for x, y in zip(got_b, ref_b))
    assert not arrays.equal(got_a[-1], got_b[-1])  # the two really are different conversations


def test_logits_and_captured_states_are_numpy_and_the_state_views_its_blob(granite):
    """No torch on this backend: numpy logits, and a captured state whose arrays are views of the blob
    llama.cpp wrote (no copy), which restoring it hands back to llama.cpp as it is."""
    live = granite.new_live()
    logits = granite.prefill(live, _ids(20, 5))
    assert arrays.kind(logits) == granite.spec.arrays == "numpy"
    state = granite.capture(live)
    blob, _serial = granite._pool.original(state)
    raw = np.frombuffer(blob, np.uint8)
    views = [t for layer in state.layers for t in layer.tensors().values() if t.size]
    assert views and all(arrays.kind(t) == "numpy" and np.shares_memory(t, raw) for t in views)
    assert arrays.kind(state.last_logits) == "numpy" and not np.shares_memory(state.last_logits, logits)
    granite.release(live)


def test_an_older_live_continues_after_a_restored_copy_of_it_ran(granite):
    live = granite.new_live()
    granite.prefill(live, _ids(30, 3))
    state = granite.capture(live)
    copy = granite.inject(state)  # now resident; `live` is parked
    more = _ids(5, 4)
    from_copy = granite.prefill(copy, more).copy()
    from_live = granite.prefill(live, more).copy()
    assert arrays.equal(from_copy, from_live)
    recaptured = granite.capture(granite.inject(state))
    for before, after in zip(state.layers, recaptured.layers):
        assert all(arrays.equal(t, after.tensors()[k]) for k, t in before.tensors().items())


def test_release_frees_the_sequence_and_the_parked_copy(granite):
    lives = [granite.new_live() for _ in range(3)]
    for i, live in enumerate(lives):
        granite.prefill(live, _ids(10 + i, i))
    parked = lives[0].cache.blob
    assert parked is not None and lives[2].cache.blob is None  # only the last one is in llama.cpp
    assert granite._pool.last_position() == 11  # the resident one: 12 tokens
    for live in lives:
        granite.release(live)
    assert granite._pool.last_position() == -1  # nothing left in the context
    assert all(live.cache is None for live in lives)
    with pytest.raises(EngramError, match="released"):
        granite.decode(lives[0], 5)


class _SetAfter(threading.Event):
    """An event that reads as set from its (n+1)-th check on: cancels after n chunks."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        return self.n < 0


def test_prefill_cancels_between_chunks_and_keeps_whole_chunks(granite):
    ids = _ids(40, 5)
    whole = granite.prefill(granite.new_live(), ids).copy()
    live = granite.new_live()
    with pytest.raises(Cancelled):
        granite.prefill(live, ids, cancel=_SetAfter(1))
    assert live.token_ids == ids[:16]  # chunk_tokens=16: one chunk ran, the next never started
    assert arrays.equal(granite.prefill(live, ids[16:]), whole)  # same chunk boundaries: same bits


def test_capture_refuses_an_empty_state_and_inject_a_foreign_layout(granite, gguf_zoo, load_llama):
    with pytest.raises(EngramError, match="no tokens"):
        granite.capture(granite.new_live())
    mamba = load_llama(gguf_zoo.path("mamba2"))
    live = mamba.new_live()
    mamba.prefill(live, _ids(4, 6))
    from engramctl.errors import SnapshotMismatch

    with pytest.raises(SnapshotMismatch, match="layout"):
        granite.inject(mamba.capture(live))


def test_model_info_names_backend_weight_type_and_context(granite, gguf_zoo):
    info = granite.info
    assert (info.backend, info.weight_type, info.family) == ("llama.cpp", "F32", "granitehybrid")
    assert info.weights_bytes > 0 and info.context_length == granite.n_ctx
    assert granite.spec.backend == "llama.cpp" and granite.spec.state_format.startswith("llama.cpp-seq3")


def test_a_captured_state_restores_from_its_own_blob_and_a_copy_by_reserializing(granite, tmp_path):
    from tests.snapshot_io import read_state, write_state

    live = granite.new_live()
    granite.prefill(live, _ids(25, 8))
    state = granite.capture(live)
    write_state(tmp_path / "s.safetensors", state, granite.spec)
    from_disk = read_state(tmp_path / "s.safetensors", granite.spec)
    assert granite._pool.original(state) is not None  # kept in RAM as captured: one copy to restore
    assert granite._pool.original(from_disk) is None  # other tensors: serialized again
    more = _ids(4, 9)
    assert arrays.equal(granite.prefill(granite.inject(state), more), granite.prefill(granite.inject(from_disk), more))


def test_a_state_in_the_ram_tier_restores_from_its_captured_blob(granite, tmp_path, monkeypatch):
    """The daemon's restore path (store -> from_payload -> inject): a snapshot still in the RAM tier
    reaches inject as the very tensors capture made, so the restore is one copy into llama.cpp."""
    from engramctl.settings import load_settings
    from engramctl.state.codec import from_payload, to_payload
    from engramctl.store.store import Store
    from tests.helpers import open_planned

    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
    store = open_planned(load_settings({"tier_ram_bytes": 64 << 20, "tier_disk_bytes": 256 << 20}))[0]
    try:
        live = granite.new_live()
        granite.prefill(live, _ids(30, 10))
        rec = store.snapshots.commit("s", to_payload(granite.capture(live), granite.spec, {}))
        payload, came_from = store.snapshots.load_from(rec.id)
        assert came_from in ("ram", "pending")
        state = from_payload(*payload, granite.spec, check_values=False)
        assert granite._pool.original(state) is not None
        store.flush()
        store.close()
        store = Store.open(load_settings({"tier_ram_bytes": 64 << 20, "tier_disk_bytes": 256 << 20}))  # reads only
        payload, came_from = store.snapshots.load_from(rec.id)  # a fresh process's view: read from the file
        assert came_from == "disk"
        from_disk = from_payload(*payload, granite.spec)
        more = _ids(3, 11)
        assert arrays.equal(
            granite.prefill(granite.inject(state), more), granite.prefill(granite.inject(from_disk), more)
        )
    finally:
        store.close()
