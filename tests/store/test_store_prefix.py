"""store.candidates.find: the stored states whose ids are an exact prefix of a prompt's, longest first; hashes
nominate, ids decide."""

from __future__ import annotations

from payloads import FINGERPRINT

from engramctl.store.prefix import token_hash


def longest(store, ids, fingerprint, **kw):
    """(id, n_tokens) of the longest candidate, or None."""
    found = store.candidates.find(ids, fingerprint, **kw)
    return (found[0].id, found[0].n_tokens) if found else None


def test_longest_prefix_wins(store, make_payload):
    base = list(range(10, 60))
    short = store.snapshots.commit("a", make_payload(0, 1, token_ids=base[:10]))
    long = store.snapshots.commit("a", make_payload(0, 2, token_ids=base[:30]))
    store.snapshots.commit("b", make_payload(0, 3, token_ids=base[:20] + [999]))  # diverges
    store.flush()
    found = store.candidates.find(base, FINGERPRINT)
    assert [(c.id, c.n_tokens, c.kind, c.session) for c in found] == [
        (long.id, 30, "snapshot", "a"),
        (short.id, 10, "snapshot", "a"),
    ]
    assert longest(store, base[:25], FINGERPRINT) == (short.id, 10)
    assert longest(store, base[:30], FINGERPRINT) == (long.id, 30)  # an exact match counts
    assert longest(store, base, "other-model") is None
    assert longest(store, [1, 2, 3], FINGERPRINT) is None
    assert longest(store, base, FINGERPRINT, session="b") is None
    assert longest(store, base, FINGERPRINT, session="a") == (long.id, 30)
    assert longest(store, base, FINGERPRINT, exclude={long.id}) == (short.id, 10)
    assert longest(store, base, FINGERPRINT, min_tokens=11) == (long.id, 30)
    assert len(store.candidates.find(base, FINGERPRINT, limit=1)) == 1


def test_prefix_from_disk_after_reopen(open_store, make_payload):
    s = open_store()
    rec = s.snapshots.commit("a", make_payload(0, 1, token_ids=[5, 6, 7, 8]))
    s.close()
    s = open_store()
    assert s.snapshots.info(rec.id).tiers == ("disk",)
    (found,) = s.candidates.find([5, 6, 7, 8, 9], FINGERPRINT)
    assert (found.id, found.n_tokens, found.tier) == (rec.id, 4, "disk")
    assert found.size_bytes == s.snapshots.info(rec.id).nbytes


def test_hash_match_alone_is_not_a_match(store, make_payload):
    """Simulate a hash collision: the index says this snapshot's ids hash like the query's prefix,
    but its real ids differ. the lookup must compare the ids and reject it."""
    real = store.snapshots.commit("a", make_payload(0, 1, token_ids=[1, 2, 3, 4]))
    store.flush()
    query = [9, 9, 9, 9, 9]
    store._index.execute("UPDATE snapshots SET token_hash = ? WHERE id = ?", (token_hash(query[:4]), real.id))
    assert longest(store, query, FINGERPRINT) is None
    store._index.execute("UPDATE snapshots SET token_hash = ? WHERE id = ?", (token_hash([1, 2, 3, 4]), real.id))
    assert longest(store, [1, 2, 3, 4, 5], FINGERPRINT) == (real.id, 4)


def test_pending_snapshots_are_found(store, make_payload):
    rec = store.snapshots.commit("a", make_payload(0, 1, token_ids=[3, 1, 4, 1, 5]))
    (found,) = store.candidates.find([3, 1, 4, 1, 5, 9], FINGERPRINT)
    assert found.id == rec.id and found.tier in ("ram", "pending")
