"""Prefix states (store/prefixes.py) on a real tiny hybrid's states: put is content-addressed by the token
ids, longest finds the longest stored exact prefix, load gives the state back bitwise and marks it used, the
prefix budget evicts the least recently used, they survive a restart, share KV blocks with snapshots, and stay
out of the snapshot listings."""

from __future__ import annotations

import pytest
from checks import assert_consistent
from conftest import fake_hardware
from test_store_blocks import TWO, disk, ids_of, same, states

from engramctl.errors import NotFound, SnapshotCorrupt, UsageError
from engramctl.settings import load_settings
from engramctl.state.codec import from_payload
from tests.helpers import open_planned

FAMILY = "granitemoehybrid"


@pytest.fixture(scope="module")
def backend(zoo, load_backend):
    return load_backend(zoo.path(FAMILY), chunk_tokens=64)


@pytest.fixture
def open_prefix_store(engram_home, clock):
    opened = []

    def _open(prefix_bytes=None, **flags):
        settings = load_settings(
            {"tier_ram_bytes": 0, "tier_disk_bytes": "256MB", "prefix_state_bytes": prefix_bytes, **flags}
        )
        store, _ = open_planned(settings, fake_hardware(), clock=clock)
        opened.append(store)
        return store

    yield _open
    for s in opened:
        s.close()


def longest(store, ids, fingerprint, kinds=("prefix",)):
    """(id, n_tokens) of the longest prefix state of `ids` the store's lookup finds, or None."""
    found = store.candidates.find(ids, fingerprint, kinds=kinds)
    return (found[0].id, found[0].n_tokens) if found else None


def put(store, payload) -> str:
    tensors, meta = payload
    return store.prefixes.put(tensors, meta, tensors["token_ids"].tolist())


def test_put_longest_load(backend, open_prefix_store):
    ids = ids_of(400)
    (p40,) = states(backend, ids, [40])
    (p300,) = states(backend, ids, [300])
    fp = backend.spec.fingerprint
    s = open_prefix_store()
    a, b = put(s, p40), put(s, p300)
    assert put(s, p300) == b and len(s.prefixes.list()) == 2  # the same ids again: a no-op
    assert longest(s, ids[:300] + [7, 8, 9], fp) == (b, 300)
    assert longest(s, ids[:300], fp) == (b, 300)  # all of the prompt counts too
    assert longest(s, ids[:299], fp) == (a, 40)
    assert longest(s, ids[:200] + ids_of(50, seed=3), fp) == (a, 40)
    assert longest(s, ids[:39], fp) is None
    assert longest(s, ids_of(400, seed=2), fp) is None
    assert longest(s, ids, "another model") is None
    assert longest(s, ids, None) == (b, 300)  # no fingerprint: any model's
    loaded = s.prefixes.load(b)  # pending or in memory: the payload as put
    assert same(loaded, p300)
    s.flush()
    loaded, came_from = s.prefixes.load_from(b)
    assert same(loaded, p300)
    from_payload(*loaded, backend.spec)
    # hidden from the snapshots and sessions, and from the snapshots' own prefix lookup
    assert s.snapshots.list() == [] and s.sessions.list() == []
    assert longest(s, ids, fp, kinds=("snapshot",)) is None
    with pytest.raises(NotFound):
        s.prefixes.info(s.snapshots.commit("chat", p40).id)
    s.flush()
    assert s.prefixes.usage()[:2] == (s._index.durable_bytes("prefix")[0], 2)
    assert_consistent(s)


def test_prefix_states_survive_a_restart_and_share_blocks_with_snapshots(backend, open_prefix_store, engram_home):
    ids = ids_of(TWO + 40)
    (p_two,) = states(backend, ids, [TWO])
    s = open_prefix_store()
    rec = s.snapshots.commit("chat", p_two)
    s.flush()
    blocks_before = disk(engram_home)[2]
    pid = put(s, p_two)
    s.flush()
    assert disk(engram_home)[2] == blocks_before == 2  # the prefix state's KV is the snapshot's blocks
    assert s.prefixes.info(pid).shared_size_bytes == s.snapshots.info(rec.id).shared_size_bytes > 0
    s.close()
    s = open_prefix_store()
    assert s.reconcile_report.clean
    assert longest(s, ids, backend.spec.fingerprint) == (pid, TWO)
    loaded, came_from = s.prefixes.load_from(pid)
    assert came_from == "disk" and same(loaded, p_two)
    s.snapshots.delete(rec.id, force=True)  # the blocks stay: the prefix state uses them
    assert disk(engram_home)[2] == 2 and same(s.prefixes.load(pid), p_two)
    s.prefixes.delete(pid)
    assert disk(engram_home) == (0, 0, 0)


def test_the_prefix_budget_evicts_the_least_recently_used(backend, open_prefix_store, clock):
    p1, p2, p3 = (states(backend, ids_of(300, seed=k), [300])[0] for k in (1, 2, 3))
    s = open_prefix_store()
    a = put(s, p1)
    s.flush()
    one = s.prefixes.usage()[0]
    s.close()
    s = open_prefix_store(prefix_bytes=int(2.5 * one), keep_last=1)
    assert s.prefixes.usage() == (one, 1, int(2.5 * one))
    clock.advance(1)
    b = put(s, p2)
    s.flush()
    clock.advance(1)
    s.prefixes.load(a)  # a is used again: b is now the least recently used
    clock.advance(1)
    c = put(s, p3)
    s.flush()
    assert {p.id for p in s.prefixes.list()} == {a, c}
    with pytest.raises(NotFound):
        s.prefixes.load(b)
    assert longest(s, p2[0]["token_ids"].tolist(), None) is None
    s.retention.gc()  # keep-last (1) does not apply to prefix states
    assert {p.id for p in s.prefixes.list()} == {a, c}
    assert_consistent(s)


def test_a_damaged_prefix_state_is_dropped_not_used(backend, open_prefix_store, engram_home):
    (p,) = states(backend, ids_of(300), [300])
    s = open_prefix_store()
    pid = put(s, p)
    s.flush()
    s.close()
    path = engram_home / "snapshots" / f"{pid}.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 4
    path.write_bytes(bytes(data))
    s = open_prefix_store()
    with pytest.raises(SnapshotCorrupt):
        s.prefixes.load(pid)
    assert longest(s, ids_of(300), None) is None and s.prefixes.list() == []
    assert_consistent(s)


def test_put_refuses_ids_that_disagree_with_the_state(backend, open_prefix_store):
    (p,) = states(backend, ids_of(50), [50])
    tensors, meta = p
    s = open_prefix_store()
    with pytest.raises(UsageError, match="token_ids"):
        s.prefixes.put(tensors, meta, ids_of(50, seed=9))
    with pytest.raises(UsageError, match="at least one"):
        s.prefixes.put(tensors, meta, [])
    without = {k: v for k, v in tensors.items() if k != "token_ids"}
    pid = s.prefixes.put(without, meta, ids_of(50))  # the ids given become its token_ids
    assert same(s.prefixes.load(pid), p)


def test_a_state_of_another_dtype_is_neither_found_nor_taken_for_the_same(backend, open_prefix_store):
    """The model fingerprint is dtype-independent: the lookup and put's "the same ids again" also compare the
    dtype (and state format) the metadata records, from memory and from the file's header."""
    ids = ids_of(100)
    (p,) = states(backend, ids, [100])
    tensors, meta = p
    fp, dtype = meta["fingerprint"], meta["dtype"]
    s = open_prefix_store()
    other = s.prefixes.put(tensors, {**meta, "dtype": "bfloat16"}, ids)
    assert s.candidates.find(ids, fp, state={"dtype": dtype}) == []
    assert [c.id for c in s.candidates.find(ids, fp, state={"dtype": "bfloat16"})] == [other]
    mine = put(s, p)
    assert mine != other and len(s.prefixes.list()) == 2
    s.close()
    s = open_prefix_store()
    assert [c.id for c in s.candidates.find(ids, fp, state={"dtype": dtype, "state_format": meta["state_format"]})] == [
        mine
    ]
    assert put(s, p) == mine
