"""Keeping a prefix state is off the turn loop (daemon/prefix_states.py): `offer` returns at once, the keeper thread
flattens and commits the state beside the next step, the claim holds until the state is in the store (a prompt
waiting for it finds it there), and the turn's end waits for the states it offered. A capture copies the state
into memory a collected capture left (engine/llama_buffers.py), bit for bit what a fresh copy holds."""

from __future__ import annotations

import gc
import threading

import pytest

from tests.daemon.test_prefix_states import engines  # noqa: F401 - the module's engine fixture
from tests.helpers.inprocess import InProcessDaemon


def _state(engine, ids):
    live = engine.new_live()
    engine.prefill(live, ids)
    state = engine.capture(live)
    engine.release(live)
    return state


def test_an_offered_state_is_kept_beside_the_turn_and_its_claim_held_until_then(engines, engram_home):  # noqa: F811
    from engramctl.daemon.prefix_states import PrefixStates, _keeper

    engine = engines("llama.cpp", "granitemoehybrid")
    ids = list(range(5, 45))
    with InProcessDaemon(engine) as d:
        prefixes = PrefixStates(engine, d.store)
        owner = object()
        prefixes.claim(owner, ids, [len(ids)])
        gate = threading.Event()
        _keeper().submit(gate.wait, 30)  # the keeper busy: the offer is seen in flight
        job = prefixes.offer(ids, _state(engine, ids))
        assert not job.done()
        assert prefixes.awaited([*ids, 7], 0) is not None  # a prompt beginning alike still waits for it
        assert d.store.prefixes.list() == []
        ended = threading.Thread(target=prefixes.ended, args=(owner,))
        ended.start()
        ended.join(0.3)
        assert ended.is_alive()  # the turn's end waits for the state it offered
        gate.set()
        ended.join(30)
        assert not ended.is_alive() and job.done()
        pid = job.result()
        assert [r.id for r in d.store.prefixes.list()] == [pid]
        assert prefixes.awaited([*ids, 7], 0) is None and prefixes.counts()["kept_since_start"] == 1


def test_a_state_that_cannot_be_kept_releases_its_claim(engines, engram_home):  # noqa: F811
    from engramctl.daemon.prefix_states import PrefixStates

    engine = engines("llama.cpp", "granitemoehybrid")
    ids = list(range(5, 30))
    with InProcessDaemon(engine) as d:
        prefixes = PrefixStates(engine, d.store)
        prefixes.claim("turn", ids, [len(ids)])
        job = prefixes.offer(ids[:-1], _state(engine, ids))  # ids that disagree with the state: refused
        assert job.result(30) is None
        prefixes.offer(ids, _state(engine, ids)).result(30)
        assert prefixes.awaited([*ids, 7], 0) is None and prefixes.counts()["kept_since_start"] == 1


def _root_address(state) -> int:
    root = next(t for layer in state.layers for t in layer.tensors().values())
    while root.base is not None:
        root = root.base
    return root.ctypes.data


def test_a_capture_reuses_the_memory_of_a_collected_one_bit_for_bit(engines):  # noqa: F811
    from engramctl.engine import llama_state

    engine = engines("llama.cpp", "granitemoehybrid")
    backend = engine.backend
    if backend._pool.streams:
        pytest.skip("a context of KV streams captures into a new bytearray (one_stream cuts it)")
    first = _state(engine, list(range(5, 45)))
    address = _root_address(first)
    del first
    gc.collect()
    live = engine.new_live()
    engine.prefill(live, list(range(50, 90)))  # as many tokens: a state of the same size
    reused, fresh_buffers = backend._buffers.reused, backend._buffers.fresh
    held = {b.ctypes.data for b in backend._buffers._owned}
    again = engine.capture(live)
    assert (backend._buffers.reused, backend._buffers.fresh) == (reused + 1, fresh_buffers)
    assert address in held and _root_address(again) in held  # memory a collected capture left, not new
    n = len(live.token_ids)
    fresh = llama_state.in_position_order(backend._pool.get_blob(live.cache.seq), backend.layout, n)  # a bytearray
    want = [t.tobytes() for layer in llama_state.parse(fresh, backend.layout, n) for t in layer.tensors().values()]
    assert [t.tobytes() for layer in again.layers for t in layer.tensors().values()] == want
    engine.release(live)
