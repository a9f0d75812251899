"""engine/llama_buffers.py: a restored blob's memory goes back to the pool when the last view of it goes, and the
next restore of a similar size takes it; a buffer still referred to is never handed out again; free buffers
beyond `keep` are let go."""

from __future__ import annotations

import gc

import numpy as np

from engramctl.engine.llama_buffers import HostBuffers


def test_a_buffer_is_reused_only_once_nothing_refers_to_it():
    pool = HostBuffers(keep=2)
    first = pool.take(1000)
    view = first[:800].view(np.uint16)  # what a restore hands out: views whose base is the buffer
    del first
    second = pool.take(1000)
    assert second.ctypes.data != view.ctypes.data  # still referred to by `view`: a new one
    assert (pool.fresh, pool.reused) == (2, 0)
    address = view.ctypes.data
    del view
    gc.collect()
    third = pool.take(900)  # within 1.5x: the free one, already in memory
    assert third.ctypes.data == address and pool.reused == 1
    assert pool.take(100).ctypes.data not in (address, second.ctypes.data)  # too large a waste for 100 bytes


def test_free_buffers_beyond_keep_are_let_go():
    pool = HostBuffers(keep=1)
    taken = [pool.take(4096 * (i + 1)) for i in range(3)]
    del taken
    assert pool.free_count() == 3
    big = pool.take(10**6)  # fits none: the free ones beyond `keep` go first
    assert pool.free_count() == 1
    assert pool.held_bytes() == big.nbytes + 4096  # the largest free ones went


def test_a_buffer_prepared_ahead_serves_the_next_take():
    pool = HostBuffers(keep=2)
    job = pool.prepare(10_000)
    assert job is not None
    job.result(30)
    assert (pool.prepared, pool.free_count()) == (1, 1)
    assert pool.prepare(9_000) is None  # a free one fits it already
    address = pool._owned[0].ctypes.data
    taken = pool.take(8_000)
    assert taken.ctypes.data == address and (pool.reused, pool.fresh) == (1, 0)
    pool.prepare(8_000).result(30)  # the one taken is not free: another is made
    assert pool.prepared == 2 and pool.free_count() == 1 and taken.nbytes == 10_000
