"""The llama.cpp backend's VRAM tier (engine/llama_device_copies.py, llama_pool.py invariant 8): a parked
conversation leaves a copy of its state in memory the context owns (on the CPU build, host memory: the same
calls), resuming from it continues bit for bit, and a copy that the budget evicted or whose slot now holds
another state is never loaded: the conversation falls back to its blob."""

from __future__ import annotations

import pytest
import torch

from engramctl.engine.llama_backend import LlamaCppBackend
from engramctl.engine.llama_context import ContextSize, with_device_copies
from engramctl.engine.llama_format import BlobLayout, LayerLayout
from engramctl.store import arrays


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _load(path, copies_bytes: int, sequences: int = 2) -> LlamaCppBackend:
    return LlamaCppBackend(path, path.name, chunk_tokens=16, sequences=sequences, copies_bytes=copies_bytes)


@pytest.fixture(scope="module")
def granite(gguf_zoo):
    return _load(gguf_zoo.path("granitemoehybrid"), 64 << 20)


@pytest.fixture(scope="module")
def reference(gguf_zoo):
    """The same model without copies: what an uninterrupted conversation computes."""
    return _load(gguf_zoo.path("granitemoehybrid"), 0)


def _greedy(backend, live, steps: int) -> list:
    out = [live.last_logits.copy()]
    for _ in range(steps):
        out.append(backend.decode(live, int(out[-1].argmax())).copy())
    return out


def _uninterrupted(reference, ids: list[int], more: list[int], steps: int = 4) -> list:
    live = reference.new_live()
    reference.prefill(live, ids)
    reference.prefill(live, more)
    try:
        return _greedy(reference, live, steps)
    finally:
        reference.release(live)


def _equal(a: list, b: list) -> bool:
    return len(a) == len(b) and all(arrays.equal(x, y) for x, y in zip(a, b))


def test_a_parked_conversation_resumes_from_its_device_copy_bit_for_bit(granite, reference):
    pool = granite._pool
    assert reference._pool.device is None and pool.device.slots >= 2
    a_ids, b_ids, more = _ids(40, 1), _ids(25, 2), _ids(6, 3)
    a, b = granite.new_live(), granite.new_live()
    granite.prefill(a, a_ids)
    state = granite.capture(a)  # the daemon captures every turn (its RAM tier holds the state)
    granite.prefill(b, b_ids)  # b runs alone: a is parked, with a copy, and the kept states go (another path)
    assert pool.device.valid(a.cache.device) and a.cache.blob is not None and pool.kept == 0
    before = dict(pool.restores)
    granite.prefill(a, more)
    assert pool.restores["device"] == before.get("device", 0) + 1
    assert pool.restores["blob"] == before.get("blob", 0)
    assert _equal(_greedy(granite, a, 4), _uninterrupted(reference, a_ids, more))
    assert a.cache.device is None  # a moved on: its copy is no longer its state
    held = pool.device.held
    granite.release(b)  # b's copy (b was parked when a resumed) goes with it
    assert pool.device.held == held - 1
    granite.release(a)
    del state


def test_a_copy_evicted_by_the_budget_falls_back_to_the_blob(gguf_zoo, reference):
    backend = _load(gguf_zoo.path("granitemoehybrid"), 64 << 20)
    pool = backend._pool
    a, b, c = (backend.new_live() for _ in range(3))
    ids = {id(a): _ids(30, 4), id(b): _ids(30, 5), id(c): _ids(30, 6)}
    backend.prefill(a, ids[id(a)])
    backend.prefill(b, ids[id(b)])  # parks a with a copy
    pool.device.budget_bytes = a.cache.device.size_bytes * 3 // 2  # room for one copy of this size
    backend.prefill(c, ids[id(c)])  # parks b: its copy takes the room of a's, the least recently used
    assert pool.device.valid(b.cache.device) and not pool.device.valid(a.cache.device)
    assert pool.device.used_bytes <= pool.device.budget_bytes and pool.device.held == 1
    more = _ids(5, 7)
    before = pool.restores["blob"]
    backend.prefill(a, more)
    assert pool.restores["blob"] == before + 1
    assert _equal(_greedy(backend, a, 3), _uninterrupted(reference, ids[id(a)], more, 3))


def test_a_conversation_that_ran_in_a_batch_parks_without_a_copy(granite, reference):
    """Its KV cells are interleaved with the other's: llama.cpp cannot copy several cell ranges (it aborts)."""
    a, b = granite.new_live(), granite.new_live()
    a_ids, b_ids = _ids(20, 8), _ids(20, 9)
    granite.prefill(a, a_ids[:10])
    granite.prefill(b, b_ids[:10])
    granite.step([(a, a_ids[10:]), (b, b_ids[10:])])
    c = granite.new_live()
    granite.prefill(c, _ids(12, 10))  # alone: a and b are parked
    assert a.cache.device is None and b.cache.device is None and a.cache.blob is not None
    more = _ids(4, 11)
    granite.prefill(a, more)
    assert _equal(_greedy(granite, a, 2), _uninterrupted(reference, a_ids, more, 2))
    for live in (a, b, c):
        granite.release(live)


def test_a_slot_that_saved_another_state_never_loads_the_old_copy(gguf_zoo, reference):
    """llama.cpp keeps one copy per slot: loading a replaced one would abort or silently load the other state."""
    backend = _load(gguf_zoo.path("granitemoehybrid"), 64 << 20)  # fresh: no slot has a buffer yet
    pool = backend._pool
    a, b, c = (backend.new_live() for _ in range(3))
    a_ids = _ids(30, 12)
    backend.prefill(a, a_ids)
    backend.prefill(b, _ids(30, 13))  # parks a with a copy
    old = a.cache.device
    pool.device.drop(old)  # what eviction does
    backend.prefill(c, _ids(30, 14))  # parks b: a state of a's size takes the slot with a buffer of that size
    assert b.cache.device.slot == old.slot and not pool.device.valid(old)
    a.cache.device = old  # as if a still held it
    more = _ids(4, 15)
    backend.prefill(a, more)  # from its blob, not the slot's new state
    assert pool.restores["device"] == 0
    assert _equal(_greedy(backend, a, 2), _uninterrupted(reference, a_ids, more, 2))


def test_a_recurrent_only_model_copies_whatever_ran_in_a_batch(gguf_zoo):
    """A pure Mamba2 state is one recurrent cell: any conversation's state can be copied."""
    path = gguf_zoo.path("mamba2")
    backend, ref = _load(path, 16 << 20), _load(path, 0)
    a, b = backend.new_live(), backend.new_live()
    a_ids, b_ids = _ids(16, 20), _ids(16, 21)
    backend.step([(a, a_ids), (b, b_ids)])
    c = backend.new_live()
    backend.prefill(c, _ids(8, 22))
    assert backend._pool.device.valid(a.cache.device)
    more = _ids(3, 23)
    backend.prefill(a, more)
    assert backend._pool.restores["device"] >= 1
    assert _equal(_greedy(backend, a, 2), _uninterrupted(ref, a_ids, more, 2))


def test_slots_come_from_the_budget_the_chunk_and_the_kv_layout():
    hybrid = BlobLayout(
        (LayerLayout("recurrent", conv_shape=(8, 3), ssm_shape=(4, 8, 16)), LayerLayout("attention", 64, 64))
    )
    cell = 4 * (8 * 3 + 4 * 8 * 16)
    copy = cell + 2 * 128 * 2048
    size = ContextSize(n_ctx=4096, sequences=4, kept_max=4)
    got = with_device_copies(size, hybrid, 10 * (cell + copy) + 5, chunk_tokens=512)
    assert (got.device_slots, got.device_bytes) == (10, 10 * (cell + copy) + 5 - 10 * cell)
    assert got.n_seq_max == 18
    assert with_device_copies(size, hybrid, 100 * (cell + copy), chunk_tokens=16).device_slots == 8  # 16 - 4 - 4
    assert with_device_copies(size, hybrid, cell + copy - 1, chunk_tokens=512).device_slots == 0
    streams = ContextSize(n_ctx=4096, sequences=4, kept_max=0, streams=True)
    assert with_device_copies(streams, hybrid, 1 << 30, chunk_tokens=512).device_slots == 0


_NO_ROOM = """
import sys
from pathlib import Path
from engramctl.engine.llama_backend import LlamaCppBackend
p = Path(sys.argv[1])
b = LlamaCppBackend(p, p.name, chunk_tokens=64, sequences=2, context_tokens=256, copies_bytes=64 << 20)
pool = b._pool
a, c = b.new_live(), b.new_live()
b.prefill(a, list(range(5, 105)))
b.prefill(c, list(range(5, 205)))  # parks a with a copy; c holds cells 0..199 of 256
seq = pool._free_seqs.pop()
print("loaded", pool.device.load(a.cache.device, seq), "still valid", pool.device.valid(a.cache.device))
"""


def test_a_copy_that_finds_no_room_is_refused_without_harm(gguf_zoo):
    """Beside a resident conversation the KV cache may lack a free range as long as the copy: llama.cpp refuses it
    (0 bytes read) and the process goes on; a child process, because a newer llama.cpp asserts there."""
    import subprocess
    import sys

    path = gguf_zoo.path("granitemoehybrid")
    out = subprocess.run(
        [sys.executable, "-c", _NO_ROOM, str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "loaded False still valid True"


def test_a_copy_resumed_in_a_batch_lays_its_cells_out_as_its_blob_does(granite, reference):
    """Loaded beside another conversation (seat, not solo): the batch computes bit for bit what the same batch
    computes after loading the blob (a batch may differ from a lone run in the last bits, not from itself)."""
    got = {}
    for backend in (granite, reference):
        a, b, c = backend.new_live(), backend.new_live(), backend.new_live()
        backend.prefill(a, _ids(30, 30))
        backend.prefill(b, _ids(20, 31))  # parks a (with a copy where there are slots)
        backend.prefill(c, _ids(10, 32))
        before = backend._pool.restores["device"]
        out = backend.step([(a, _ids(3, 33)), (c, _ids(2, 34))])
        got[backend is granite] = ([x.copy() for x in out], backend._pool.restores["device"] - before)
        for live in (a, b, c):
            backend.release(live)
    assert got[True][1] == 1 and got[False][1] == 0
    assert _equal(got[True][0], got[False][0])
