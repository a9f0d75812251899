"""Commit, load, info, list, delete, heads, pins and labels."""

from __future__ import annotations

import os
import stat

import pytest
from payloads import FINGERPRINT, nbytes, same_payload

from engramctl.errors import InvalidName, NotFound
from engramctl.errors import AlreadyExists, SnapshotInUse, StoreLocked
from engramctl.store.names import SNAPSHOT_ID_RE
from engramctl.store.store import Store


def test_commit_is_hot_at_once_then_durable(store, make_payload):
    p = make_payload(50, 1)
    rec = store.snapshots.commit("chat", p)
    assert SNAPSHOT_ID_RE.fullmatch(rec.id)
    assert rec.tiers[0] == "ram" and rec.n_tokens == 50 and rec.fingerprint == FINGERPRINT
    assert same_payload(store.snapshots.load(rec.id), p)  # readable before the write finished
    assert store.flush(timeout=10)
    info = store.snapshots.info(rec.id)
    assert info.durable and info.tiers == ("ram", "disk") and info.checksum.startswith("xxh3_128:")
    assert store.sessions.get("chat").head == rec.id


def test_load_from_disk_after_reopen_verifies_and_promotes(open_store, make_payload):
    s = open_store()
    p = make_payload(30, 2)
    rec = s.snapshots.commit("chat", p)
    s.close()
    s = open_store()
    assert s.snapshots.info(rec.id).tiers == ("disk",)
    got = s.snapshots.load(rec.id)
    assert same_payload(got, p) and got[1]["snapshot_id"] == rec.id and "checksum" in got[1]
    assert s.snapshots.info(rec.id).tiers == ("ram", "disk")


def test_load_copy_returns_independent_tensors(store, make_payload):
    rec = store.snapshots.commit("chat", make_payload(10, 3))
    a = store.snapshots.load(rec.id, copy=True)
    a[0]["layers.0.conv"].zero_()
    assert not same_payload(a, store.snapshots.load(rec.id))


def test_parent_chain_and_ids_sort_by_time(store, make_payload, clock):
    ids = []
    for i in range(5):
        ids.append(store.snapshots.commit("chat", make_payload(10 + i, i)).id)
        clock.advance(0.0001 if i % 2 else 1)
    assert ids == sorted(ids)
    recs = store.snapshots.list("chat")
    assert [r.id for r in recs] == ids
    assert [r.parent for r in recs] == [None] + ids[:-1]


def test_files_and_dirs_are_private(store, make_payload, engram_home):
    store.snapshots.commit("chat", make_payload(10, 1))
    store.flush()
    for p in [engram_home, *engram_home.rglob("*")]:
        if p.parent.name == "config" or p.name in ("logs", "run", "cache", "config"):
            continue  # made by Paths.ensure elsewhere, not by the store
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), (p, oct(mode))


def test_delete_head_refused_unless_forced(store, make_payload):
    a = store.snapshots.commit("chat", make_payload(10, 1))
    b = store.snapshots.commit("chat", make_payload(20, 2))
    store.flush()
    with pytest.raises(SnapshotInUse, match="head"):
        store.snapshots.delete(b.id)
    store.snapshots.delete(a.id)  # not a head: fine; b is re-parented
    assert store.snapshots.info(b.id).parent is None
    store.snapshots.delete(b.id, force=True)
    assert store.sessions.get("chat").head is None
    with pytest.raises(NotFound):
        store.snapshots.load(b.id)
    assert not list((store.settings.paths.data_dir / "snapshots").iterdir())


def test_forced_delete_of_head_falls_back_to_parent(store, make_payload):
    a = store.snapshots.commit("chat", make_payload(10, 1), messages=[{"role": "user", "content": "1"}])
    b = store.snapshots.commit("chat", make_payload(20, 2), messages=[{"role": "assistant", "content": "2"}])
    store.snapshots.delete(b.id, force=True)
    sess = store.sessions.get("chat")
    assert sess.head == a.id and sess.n_messages == 2  # transcript intact: re-prefill the rest
    assert store.snapshots.info(a.id).n_messages == 1


def test_pinned_delete_refused_and_labels(store, make_payload):
    a = store.snapshots.commit("chat", make_payload(10, 1), pinned=True, label="start")
    store.snapshots.commit("chat", make_payload(12, 2))
    assert store.snapshots.info(a.id).pinned and store.snapshots.info(a.id).label == "start"
    with pytest.raises(SnapshotInUse, match="pinned"):
        store.snapshots.delete(a.id)
    store.snapshots.unpin(a.id)
    assert store.snapshots.label(a.id, None).label is None
    with pytest.raises(InvalidName):
        store.snapshots.label(a.id, "bad\nlabel")
    store.snapshots.delete(a.id)


def test_set_head_rewinds_transcript(store, make_payload):
    a = store.snapshots.commit("chat", make_payload(10, 1), messages=[{"role": "user", "content": "q1"}])
    store.snapshots.commit(
        "chat",
        make_payload(20, 2),
        messages=[{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}],
    )
    sess = store.sessions.set_head("chat", a.id)
    assert sess.head == a.id and store.transcripts.of_session("chat") == [{"role": "user", "content": "q1"}]
    c = store.snapshots.commit("chat", make_payload(15, 3), messages=[{"role": "assistant", "content": "other"}])
    assert store.snapshots.info(c.id).parent == a.id
    assert [m["content"] for m in store.transcripts.of_session("chat")] == ["q1", "other"]


def test_resolve_prefix(store, make_payload):
    rec = store.snapshots.commit("chat", make_payload(10, 1))
    assert store.resolve(rec.id[:12]) == rec.id
    with pytest.raises(NotFound):
        store.resolve("ffff")


def test_create_get_list_delete_sessions(store, make_payload):
    store.sessions.create("a")
    with pytest.raises(AlreadyExists):
        store.sessions.create("a")
    store.snapshots.commit("b", make_payload(10, 1))
    assert {s.name for s in store.sessions.list()} == {"a", "b"}
    deleted = store.delete_session("b")
    store.flush()
    assert len(deleted) == 1 and not store.snapshots.list()
    with pytest.raises(NotFound):
        store.sessions.get("b")


def test_second_process_open_is_refused(store):
    with pytest.raises(StoreLocked):
        Store.open(store.settings)


def test_payload_bigger_than_ram_skips_the_tier(open_store, make_payload):
    s = open_store(ram=1000)
    p = make_payload(100, 1)
    assert nbytes(p) > 1000
    rec = s.snapshots.commit("chat", p)
    assert rec.tiers == ()  # only in the write queue until durable
    assert same_payload(s.snapshots.load(rec.id), p)
    s.flush()
    assert s.snapshots.info(rec.id).tiers == ("disk",) and s.retention.usage()["ram"] == (0, 0)


def test_disk_full_drops_snapshot_like_a_crash(open_store, make_payload):
    s = open_store(disk=20_000)
    a = s.snapshots.commit("chat", make_payload(5, 1), pinned=True)
    s.flush()
    b = s.snapshots.commit("chat", make_payload(100, 2), messages=[{"role": "user", "content": "x"}])
    s.flush()
    with pytest.raises(NotFound):
        s.snapshots.info(b.id)
    assert s.sessions.get("chat").head == a.id and s.transcripts.of_session("chat") == [
        {"role": "user", "content": "x"}
    ]
    assert "disk tier is full" in s.write_errors[-1]
    assert os.listdir(s.settings.paths.data_dir / "snapshots") == [f"{a.id}.safetensors"]


def test_wait_durable(open_store, make_payload):
    s = open_store(disk=20_000)
    rec = s.snapshots.commit("a", make_payload(5, 1))
    assert s.snapshots.wait_durable(rec.id, timeout=10).durable
    big = s.snapshots.commit("a", make_payload(200, 2))  # cannot fit: dropped
    with pytest.raises(NotFound, match="disk tier is full"):
        s.snapshots.wait_durable(big.id, timeout=10)
