"""The SQLite index: WAL, numbered migrations, refusing a newer schema, private files."""

from __future__ import annotations

import sqlite3
import stat

import pytest

from engramctl.errors import EngramError
from engramctl.store.index import Index
from engramctl.store.messages import MessageTree
from engramctl.store.schema import MIGRATIONS


def test_migrations_applied_once_and_wal(tmp_path):
    path = tmp_path / "index.db"
    idx = Index(path)
    assert idx.schema_version == len(MIGRATIONS)
    assert idx.one("PRAGMA journal_mode")[0] == "wal"
    assert idx.one("PRAGMA synchronous")[0] == 2  # FULL
    idx.close()
    idx = Index(path)  # reopening applies nothing twice
    assert idx.schema_version == len(MIGRATIONS)
    idx.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "index.db"
    Index(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    db.close()
    with pytest.raises(EngramError, match="newer engramctl"):
        Index(path)


def test_transaction_rolls_back_as_a_whole(tmp_path):
    idx = Index(tmp_path / "index.db")
    with pytest.raises(RuntimeError):
        with idx.tx():
            idx.insert_session(name="a", created=1.0, last_used=1.0)
            with idx.tx():  # nested joins the outer one
                idx.insert_session(name="b", created=1.0, last_used=1.0)
            raise RuntimeError("boom")
    assert idx.sessions() == []
    with pytest.raises(ValueError):
        idx.update_session("a", **{"name; DROP TABLE sessions": 1})


def test_long_transcript_reads_fast(tmp_path):
    import time

    idx = Index(tmp_path / "index.db")
    tr = MessageTree(idx)
    tip = tr.append(None, [{"role": "user", "content": f"message {i}"} for i in range(5000)])
    t0 = time.perf_counter()
    msgs = tr.read(tip)
    assert len(msgs) == 5000 and msgs[-1]["content"] == "message 4999"
    assert tr.read(tip, limit=3)[-1]["content"] == "message 2"
    assert time.perf_counter() - t0 < 2.0


def test_a_store_from_before_kv_blocks_opens_and_its_whole_files_load(open_store, make_payload, engram_home):
    """Schema 2 -> 3: its snapshots become kind 'snapshot', whole files with no blocks, and load as before."""
    from engramctl.store import snapshot_file

    engram_home.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(engram_home / "index.db")
    for migration in MIGRATIONS[:2]:
        db.executescript(migration)
    db.execute("PRAGMA user_version = 2")
    payload = make_payload(300, 1, blocks=True)  # even a payload that names token axes stays whole
    sid = "0" * 31 + "1"
    (engram_home / "snapshots").mkdir(exist_ok=True)
    tensors, meta = payload
    size = snapshot_file.write(engram_home / "snapshots" / f"{sid}.safetensors", tensors, {**meta, "snapshot_id": sid})
    db.execute("INSERT INTO sessions (name, head, created, last_used) VALUES ('old', ?, 1.0, 1.0)", (sid,))
    db.execute(
        "INSERT INTO snapshots (id, session, n_tokens, nbytes, n_messages, created, last_access, durable) "
        "VALUES (?, 'old', 300, ?, 0, 1.0, 1.0, 1)",
        (sid, size),
    )
    db.commit()
    db.close()
    s = open_store()
    assert s.reconcile_report.clean and s._index.schema_version == len(MIGRATIONS)
    rec = s.snapshots.info(sid)
    assert rec.kind == "snapshot" and rec.nbytes == rec.own_size_bytes == size and rec.shared_size_bytes == 0
    assert s._index.durable_bytes() == (size, 1)  # schema 4's running totals start from what the rows held
    tensors2, _ = s.snapshots.load(sid)
    assert all((tensors2[k] == tensors[k]).all() for k in tensors)
