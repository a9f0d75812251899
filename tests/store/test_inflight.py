"""Loads of one snapshot at the same time read it once (store/inflight.py on Snapshots.load_from): the second
caller waits for the first one's read and gets its payload, or its error; copy=True still copies for its caller."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from engramctl.errors import NotFound, SnapshotCorrupt
from engramctl.store.inflight import in_flight
from tests.store.slow_reads import SlowReads


def _two_loads(store, sid, reads: SlowReads, copy_second: bool = False):
    got: dict[str, object] = {}

    def load(key, copy):
        try:
            got[key] = store.snapshots.load_from(sid, copy=copy)
        except BaseException as e:  # noqa: BLE001 - the test compares what each caller got
            got[key] = e

    first = threading.Thread(target=load, args=("first", False))
    first.start()
    assert reads.started.wait(30)  # the first load is reading the file now
    second = threading.Thread(target=load, args=("second", copy_second))
    joined = in_flight(store.snapshots).joined
    second.start()
    deadline = time.monotonic() + 30
    while in_flight(store.snapshots).joined == joined:  # the second caller waits on the first one's load
        assert time.monotonic() < deadline
        time.sleep(0.005)
    reads.release.set()
    first.join(30)
    second.join(30)
    return got["first"], got["second"]


def test_a_load_of_a_snapshot_being_read_waits_for_that_read(open_store, make_payload):
    store = open_store(ram=0)  # nothing stays in memory: every load reads the files
    payload = make_payload(300, seed=3, blocks=True)
    sid = store.snapshots.commit("s", payload).id
    store.flush()
    reads = SlowReads(store)
    (p1, tier1), (p2, tier2) = _two_loads(store, sid, reads)
    assert reads.reads == 1 and tier1 == tier2 == "disk"
    assert p1 is p2  # the one payload read, shared read-only as load() documents
    assert all(torch.equal(p1[0][k], v) for k, v in payload[0].items())
    assert in_flight(store.snapshots).loading() == set()
    store.snapshots.load_from(sid)  # nothing in flight any more: a later load reads again
    assert reads.reads == 2


def test_a_copy_asked_while_another_load_reads_is_its_own(open_store, make_payload):
    store = open_store(ram=0)
    payload = make_payload(40, seed=4)
    sid = store.snapshots.commit("s", payload).id
    store.flush()
    (p1, _), (p2, _) = _two_loads(store, sid, SlowReads(store), copy_second=True)
    assert p1 is not p2 and all(torch.equal(p1[0][k], p2[0][k]) for k in payload[0])
    p2[0]["last_logits"] += 1  # the caller's copy: the shared payload is untouched
    assert torch.equal(p1[0]["last_logits"], payload[0]["last_logits"])


def test_the_waiting_caller_gets_the_reads_error(open_store, make_payload):
    store = open_store(ram=0)
    sid = store.snapshots.commit("s", make_payload(40, seed=5)).id
    store.flush()
    reads = SlowReads(store, fail=SnapshotCorrupt("the file's checksum does not match."))
    first, second = _two_loads(store, sid, reads)
    assert reads.reads == 1
    assert isinstance(first, SnapshotCorrupt) and isinstance(second, SnapshotCorrupt)
    with pytest.raises(NotFound):  # the corrupt snapshot was dropped by the one load that read it
        store.snapshots.load_from(sid)
