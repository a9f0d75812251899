"""Whole-store invariants, shared by the churn and crash tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from engramctl.store.index import _statements
from engramctl.store.names import id_from_filename
from engramctl.store.schema import MIGRATIONS


def index_of_schema(path: Path, version: int) -> sqlite3.Connection:
    """A new index at `path` as an engramctl of schema `version` made it (the first `version` migrations), open in
    autocommit: for a migration test to fill, close and open with Index()."""
    db = sqlite3.connect(path, isolation_level=None)
    for script in MIGRATIONS[:version]:
        for statement in _statements(script):
            db.execute(statement)
    db.execute(f"PRAGMA user_version = {version}")
    return db


def assert_consistent(store, verify_loads: bool = True) -> None:
    """After flush(): index and files agree, no reference dangles, budgets hold, everything loads."""
    data = store.settings.paths.data_dir
    files = {id_from_filename(p.name): p for p in (data / "snapshots").iterdir()}
    assert None not in files, f"stray files: {sorted(p.name for p in (data / 'snapshots').iterdir())}"
    snaps = {r.id: r for r in store.snapshots.list()}
    rows = {**snaps, **{r.id: r for r in store.prefixes.list()}}
    assert set(files) == set(rows), set(files) ^ set(rows)
    for sid, r in rows.items():
        assert r.durable and files[sid].stat().st_size == r.file_bytes
        assert r.nbytes == r.own_size_bytes + r.shared_size_bytes
        assert r.parent is None or r.parent in rows
    # KV blocks: every file has a durable row of its size, every row a file and a user, every use a row
    index = store._index
    block_files = {id_from_filename(p.name): p for p in (data / "blocks").iterdir()}
    assert None not in block_files, f"stray block files: {sorted(p.name for p in (data / 'blocks').iterdir())}"
    block_rows = index.blocks()
    assert set(block_files) == set(block_rows), set(block_files) ^ set(block_rows)
    for bid, row in block_rows.items():
        assert row["durable"] and block_files[bid].stat().st_size == row["nbytes"]
        users = index.block_users(bid)
        assert users and set(users) <= set(rows), (bid, users)
    # the running totals (schema 4, kept by triggers) are the sums they stand for
    summed = index.one("SELECT COALESCE(SUM(nbytes), 0), COUNT(*) FROM snapshots WHERE durable = 1")
    summed_blocks = index.one("SELECT COALESCE(SUM(nbytes), 0) FROM blocks WHERE durable = 1")
    assert index.durable_bytes() == (summed[0] + summed_blocks[0], summed[1])
    for s in store.sessions.list():
        assert s.head is None or s.head in rows
        assert s.base is None or s.base in rows
        assert len(store.transcripts.of_session(s.name)) == s.n_messages
    for sid in snaps:
        assert len(store.transcripts.of_snapshot(sid)) == rows[sid].n_messages
    for name, (used, _count) in store.retention.usage().items():
        assert used <= store.retention.plan.budget(name), (name, used, store.retention.plan.budget(name))
    if verify_loads:
        for sid in rows:
            tensors, meta = store.snapshots.load(sid)
            assert meta["snapshot_id"] == sid and int(meta["n_tokens"]) == rows[sid].n_tokens
