"""find_prefix: longest exact token-id prefix; hashes nominate, ids decide."""

from __future__ import annotations

from payloads import FINGERPRINT

from engramctl.store.prefix import token_hash


def test_longest_prefix_wins(store, make_payload):
    base = list(range(10, 60))
    short = store.snapshots.commit("a", make_payload(0, 1, token_ids=base[:10]))
    long = store.snapshots.commit("a", make_payload(0, 2, token_ids=base[:30]))
    store.snapshots.commit("b", make_payload(0, 3, token_ids=base[:20] + [999]))  # diverges
    store.flush()
    rec, n = store.snapshots.find_prefix(base, FINGERPRINT)
    assert rec.id == long.id and n == 30
    rec, n = store.snapshots.find_prefix(base[:25], FINGERPRINT)
    assert rec.id == short.id and n == 10
    assert store.snapshots.find_prefix(base[:30], FINGERPRINT)[0].id == long.id  # an exact match counts
    assert store.snapshots.find_prefix(base, "other-model") is None
    assert store.snapshots.find_prefix([1, 2, 3], FINGERPRINT) is None
    assert store.snapshots.find_prefix(base, FINGERPRINT, session="b") is None
    assert store.snapshots.find_prefix(base, FINGERPRINT, session="a")[0].id == long.id


def test_prefix_from_disk_after_reopen(open_store, make_payload):
    s = open_store()
    rec = s.snapshots.commit("a", make_payload(0, 1, token_ids=[5, 6, 7, 8]))
    s.close()
    s = open_store()
    assert s.snapshots.info(rec.id).tiers == ("disk",)
    assert s.snapshots.find_prefix([5, 6, 7, 8, 9], FINGERPRINT) == (s.snapshots.info(rec.id), 4)


def test_hash_match_alone_is_not_a_match(store, make_payload):
    """Simulate a hash collision: the index says this snapshot's ids hash like the query's prefix,
    but its real ids differ. find_prefix must compare the ids and reject it."""
    real = store.snapshots.commit("a", make_payload(0, 1, token_ids=[1, 2, 3, 4]))
    store.flush()
    query = [9, 9, 9, 9, 9]
    store._index.execute("UPDATE snapshots SET token_hash = ? WHERE id = ?", (token_hash(query[:4]), real.id))
    assert store.snapshots.find_prefix(query, FINGERPRINT) is None
    store._index.execute("UPDATE snapshots SET token_hash = ? WHERE id = ?", (token_hash([1, 2, 3, 4]), real.id))
    assert store.snapshots.find_prefix([1, 2, 3, 4, 5], FINGERPRINT)[1] == 4


def test_pending_snapshots_are_found(store, make_payload):
    rec = store.snapshots.commit("a", make_payload(0, 1, token_ids=[3, 1, 4, 1, 5]))
    assert store.snapshots.find_prefix([3, 1, 4, 1, 5, 9], FINGERPRINT)[0].id == rec.id
