"""Retention: keep-last-N, pins, labels, TTL (injectable clock), disk budget, gc."""

from __future__ import annotations

import dataclasses

from engramctl.store import retention
from engramctl.tiers.planner import TierPlanner


def ids_of(store, session=None):
    return [r.id for r in store.snapshots.list(session)]


def test_keep_last_n_per_session(open_store, make_payload):
    s = open_store(keep_last=3)
    made = [s.snapshots.commit("a", make_payload(10, i)).id for i in range(6)]
    other = [s.snapshots.commit("b", make_payload(10, 100 + i)).id for i in range(2)]
    s.flush()  # keep-last runs after each durable write
    assert ids_of(s, "a") == made[-3:]
    assert ids_of(s, "b") == other
    assert s.retention.gc().deleted == {}
    assert len(list((s.settings.paths.data_dir / "snapshots").iterdir())) == 5


def test_pinned_labelled_and_head_survive_keep_last(open_store, make_payload):
    s = open_store(keep_last=1)
    pinned = s.snapshots.commit("a", make_payload(10, 1), pinned=True).id
    labelled = s.snapshots.commit("a", make_payload(10, 2), label="good state").id
    plain = s.snapshots.commit("a", make_payload(10, 3)).id
    s.flush()
    restored = s.sessions.set_head("a", plain).head  # head is protected regardless of age
    newer = [s.snapshots.commit("b", make_payload(10, i)).id for i in range(3)]
    s.flush()
    assert set(ids_of(s, "a")) == {pinned, labelled, plain} and restored == plain
    assert ids_of(s, "b") == newer[-1:]


def test_ttl_drops_idle_sessions_snapshots_with_clock(open_store, make_payload, clock):
    s = open_store(ttl=3600)
    keep = s.snapshots.commit("old", make_payload(10, 9), pinned=True).id
    old = [
        s.snapshots.commit("old", make_payload(10, i), messages=[{"role": "user", "content": str(i)}]).id
        for i in range(2)
    ]
    shared = s.snapshots.commit("src", make_payload(10, 5)).id
    s.sessions.branch(shared, "fresh")
    s.flush()
    clock.advance(1800)
    s.sessions.touch("fresh")
    assert s.retention.gc().deleted == {}
    clock.advance(1801)  # "old" and "src" are idle now, "fresh" is not
    report = s.retention.gc()
    assert set(report.deleted) == set(old) and set(report.deleted.values()) == {"ttl"}
    assert set(ids_of(s)) == {keep, shared}  # pinned, and needed by a live branch
    sess = s.sessions.get("old")
    assert sess.head == keep and sess.n_messages == 2  # falls back; transcript kept


def test_disk_budget_evicts_least_recently_used_unpinned_first(open_store, make_payload, clock):
    from engramctl.store import snapshot_file

    size = len(snapshot_file.encode(*make_payload(10, 0)))  # ~ file size (metadata adds a little)
    s = open_store(disk=int(size * 4.5), keep_last=100)  # room for 4 files
    p = s.snapshots.commit("a", make_payload(10, 0), pinned=True).id
    c1 = s.snapshots.commit("a", make_payload(10, 1)).id
    clock.advance(1)
    c2 = s.snapshots.commit("a", make_payload(10, 2)).id
    clock.advance(1)
    c3 = s.snapshots.commit("a", make_payload(10, 3)).id
    s.flush()
    clock.advance(1)
    s.snapshots.load(c1)  # c1 is now the most recently used
    clock.advance(1)
    c4 = s.snapshots.commit("a", make_payload(10, 4)).id
    c5 = s.snapshots.commit("a", make_payload(10, 5)).id
    s.flush()
    assert ids_of(s) == [p, c1, c4, c5]  # c2 (least recently used), then c3 went; pinned stayed
    assert not set(map(str, (c2, c3))) & {f.name[:32] for f in (s.settings.paths.data_dir / "snapshots").iterdir()}
    assert s.retention.usage()["disk"][0] <= s.retention.plan.budget("disk")


def test_disk_victims_reads_the_eviction_order_only_as_far_as_it_must():
    def order():  # (id, bytes it frees with those before it), least recently used first, as the index yields them
        for i, freed in enumerate((100, 100, 50, 300)):
            seen.append(i)
            yield f"{i:032x}", freed

    seen: list[int] = []
    assert retention.disk_victims(order(), used=500, need=100, budget=400) == ([f"{0:032x}", f"{1:032x}"], True)
    assert seen == [0, 1]  # the third candidate was never read
    seen.clear()
    victims, ok = retention.disk_victims(order(), used=500, need=100, budget=0)
    assert not ok and len(victims) == 4  # all of them are not enough: the caller deletes none
    seen.clear()
    assert retention.disk_victims(order(), used=100, need=100, budget=200) == ([], True) and seen == []


def test_disk_eviction_order_lru_unlabelled_first_never_pinned_or_heads(open_store, make_payload, clock):
    s = open_store(keep_last=100, ram=0)
    ids = []
    for i in range(5):
        clock.advance(1)
        ids.append(s.snapshots.commit("a", make_payload(10, i)).id)
    s.flush()
    s.snapshots.label(ids[0], "keep me")
    s.snapshots.pin(ids[1])
    clock.advance(1)
    s.snapshots.load(ids[2])  # the most recently used now
    with s._core.lock:
        s._core.flush_touches()
        order = [sid for sid, _ in s._index.eviction_order()]
    assert order == [ids[3], ids[2], ids[0]]  # LRU, the labelled one last; pinned and the head (ids[4]) never


def test_gc_shrinks_to_new_disk_budget(open_store, make_payload):
    s = open_store(keep_last=100)
    ids = [s.snapshots.commit("a", make_payload(10, i)).id for i in range(6)]
    s.flush()
    lowered = dataclasses.replace(s.settings, tier_disk_bytes=s.retention.usage()["disk"][0] // 2)
    TierPlanner.start(lowered, s.retention, hardware=s.retention.plan.hardware)  # a daemon started with it
    used, _ = s.retention.usage()["disk"]
    assert used <= s.retention.plan.budget("disk")
    remaining = ids_of(s)
    assert remaining[-1] == ids[-1] and remaining == ids[-len(remaining) :]  # oldest went first


def test_lowered_disk_budget_applies_at_open(open_store, make_payload):
    s = open_store(keep_last=100)
    ids = [s.snapshots.commit("a", make_payload(10, i)).id for i in range(5)]
    s.close()
    used = sum(p.stat().st_size for p in (s.settings.paths.data_dir / "snapshots").iterdir())
    s = open_store(keep_last=100, disk=used // 2)
    assert s.retention.usage()["disk"][0] <= used // 2
    assert ids_of(s)[-1] == ids[-1]  # the head stays
