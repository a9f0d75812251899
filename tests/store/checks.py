"""Whole-store invariants, shared by the churn and crash tests."""

from __future__ import annotations

from engramctl.store.names import id_from_filename


def assert_consistent(store, verify_loads: bool = True) -> None:
    """After flush(): index and files agree, no reference dangles, budgets hold, everything loads."""
    data = store.settings.paths.data_dir
    files = {id_from_filename(p.name): p for p in (data / "snapshots").iterdir()}
    assert None not in files, f"stray files: {sorted(p.name for p in (data / 'snapshots').iterdir())}"
    rows = {r.id: r for r in store.snapshots.list()}
    assert set(files) == set(rows), set(files) ^ set(rows)
    for sid, r in rows.items():
        assert r.durable and files[sid].stat().st_size == r.nbytes
        assert r.parent is None or r.parent in rows
    for s in store.sessions.list():
        assert s.head is None or s.head in rows
        assert s.base is None or s.base in rows
        assert len(store.transcripts.of_session(s.name)) == s.n_messages
    for sid in rows:
        assert len(store.transcripts.of_snapshot(sid)) == rows[sid].n_messages
    for name, (used, _count) in store.retention.usage().items():
        assert used <= store.retention.plan.budget(name), (name, used, store.retention.plan.budget(name))
    if verify_loads:
        for sid in rows:
            tensors, meta = store.snapshots.load(sid)
            assert meta["snapshot_id"] == sid and int(meta["n_tokens"]) == rows[sid].n_tokens
