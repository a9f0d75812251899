"""The SQLite index: one connection in WAL mode, guarded by one re-entrant lock, migrated on open.

Every method takes the lock, so the index is safe to share between the API thread and the writer
thread; `tx()` groups several calls into one atomic transaction (BEGIN IMMEDIATE ... COMMIT).
synchronous=FULL: a committed transaction (a transcript message, say) survives a power cut.
Column names passed to the update helpers come from code, never from users, and are whitelisted.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator

from engramctl.errors import EngramError
from engramctl.store.records import SessionInfo, SnapshotRecord
from engramctl.store.schema import MIGRATIONS

SNAPSHOT_COLUMNS = (
    "id",
    "session",
    "parent",
    "n_tokens",
    "token_hash",
    "nbytes",
    "checksum",
    "fingerprint",
    "model_id",
    "tip",
    "n_messages",
    "created",
    "last_access",
    "pinned",
    "label",
    "durable",
)
SESSION_COLUMNS = ("name", "fingerprint", "model_id", "head", "base", "tip", "created", "last_used")
_SESSION_SELECT = """
    SELECT s.*, COALESCE(m.depth, 0) AS n_messages,
           (SELECT COUNT(*) FROM snapshots x WHERE x.session = s.name) AS n_snapshots
    FROM sessions s LEFT JOIN messages m ON m.id = s.tip
"""


class Index:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.lock = threading.RLock()
        if not self.path.exists():  # create it 0600 ourselves; sqlite gives -wal/-shm the same mode
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
        self._db.row_factory = sqlite3.Row
        self._depth = 0
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=OFF")  # references are kept by the store (see schema.py)
        self._migrate()

    # -- plumbing ------------------------------------------------------------------------------------
    def _migrate(self) -> None:
        with self.lock:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise EngramError(
                    f"the index {self.path} was written by a newer engramctl (schema {version}, "
                    f"this one knows {len(MIGRATIONS)}).",
                    hint="upgrade engramctl, or point ENGRAM_HOME elsewhere",
                )
            for number in range(version, len(MIGRATIONS)):
                with self.tx():
                    for statement in MIGRATIONS[number].split(";"):
                        if statement.strip():
                            self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version = {number + 1}")

    @property
    def schema_version(self) -> int:
        with self.lock:
            return self._db.execute("PRAGMA user_version").fetchone()[0]

    @contextlib.contextmanager
    def tx(self) -> Iterator[None]:
        """One atomic transaction; nested use joins the outer one."""
        with self.lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self._db.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")
            finally:
                self._depth = 0

    def execute(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Cursor:
        with self.lock:
            return self._db.execute(sql, tuple(params))

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self.lock:
            return self._db.execute(sql, tuple(params)).fetchall()

    def one(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Row | None:
        with self.lock:
            return self._db.execute(sql, tuple(params)).fetchone()

    def close(self) -> None:
        with self.lock:
            self._db.close()

    # -- sessions ------------------------------------------------------------------------------------
    def session(self, name: str) -> SessionInfo | None:
        row = self.one(_SESSION_SELECT + " WHERE s.name = ?", (name,))
        return None if row is None else _session(row)

    def sessions(self) -> list[SessionInfo]:
        return [_session(r) for r in self.rows(_SESSION_SELECT + " ORDER BY s.last_used DESC, s.name")]

    def insert_session(self, **fields: Any) -> None:
        self._insert("sessions", SESSION_COLUMNS, fields)

    def update_session(self, name: str, **fields: Any) -> None:
        self._update("sessions", SESSION_COLUMNS, "name", name, fields)

    def session_tip(self, name: str) -> int | None:
        row = self.one("SELECT tip FROM sessions WHERE name = ?", (name,))
        return None if row is None else row["tip"]

    # -- snapshots -----------------------------------------------------------------------------------
    def snapshot(self, snapshot_id: str) -> SnapshotRecord | None:
        row = self.one("SELECT * FROM snapshots WHERE id = ?", (snapshot_id,))
        return None if row is None else _snapshot(row)

    def snapshots(self, session: str | None = None) -> list[SnapshotRecord]:
        if session is None:
            return [_snapshot(r) for r in self.rows("SELECT * FROM snapshots ORDER BY id")]
        return [_snapshot(r) for r in self.rows("SELECT * FROM snapshots WHERE session = ? ORDER BY id", (session,))]

    def ancestry(self, snapshot_id: str) -> list[SnapshotRecord]:
        """The snapshot and its ancestors through `parent`, oldest first."""
        rows = self.rows(
            """WITH RECURSIVE chain(id, n) AS (
                   SELECT id, 0 FROM snapshots WHERE id = ?
                   UNION ALL SELECT s.parent, c.n + 1 FROM snapshots s JOIN chain c ON s.id = c.id
                   WHERE s.parent IS NOT NULL)
               SELECT s.* FROM chain c JOIN snapshots s ON s.id = c.id ORDER BY c.n DESC""",
            (snapshot_id,),
        )
        return [_snapshot(r) for r in rows]

    def snapshot_tip(self, snapshot_id: str) -> int | None:
        row = self.one("SELECT tip FROM snapshots WHERE id = ?", (snapshot_id,))
        return None if row is None else row["tip"]

    def ids_with_prefix(self, prefix: str, limit: int = 2) -> list[str]:
        rows = self.rows(
            "SELECT id FROM snapshots WHERE id >= ? AND id < ? ORDER BY id LIMIT ?", (prefix, prefix + "g", limit)
        )
        return [r["id"] for r in rows]

    def insert_snapshot(self, **fields: Any) -> None:
        self._insert("snapshots", SNAPSHOT_COLUMNS, fields)

    def update_snapshot(self, snapshot_id: str, **fields: Any) -> None:
        self._update("snapshots", SNAPSHOT_COLUMNS, "id", snapshot_id, fields)

    def durable_bytes(self) -> tuple[int, int]:
        row = self.one("SELECT COALESCE(SUM(nbytes), 0), COUNT(*) FROM snapshots WHERE durable = 1")
        return int(row[0]), int(row[1])

    def referrers(self, snapshot_id: str) -> list[str]:
        """Sessions whose head or branch point is this snapshot, oldest session first."""
        rows = self.rows(
            "SELECT name FROM sessions WHERE head = ? OR base = ? ORDER BY created, name", (snapshot_id, snapshot_id)
        )
        return [r["name"] for r in rows]

    def referenced_ids(self) -> set[str]:
        rows = self.rows(
            "SELECT head AS id FROM sessions WHERE head IS NOT NULL "
            "UNION SELECT base FROM sessions WHERE base IS NOT NULL"
        )
        return {r["id"] for r in rows}

    def remove_snapshots(self, ids: Iterable[str]) -> dict[str, str | None]:
        """Delete snapshot rows, keeping every reference valid: children are re-parented to the
        removed snapshot's parent, a session whose head goes falls back to the nearest surviving
        ancestor (or None: resume from the transcript), a branch point that goes is forgotten, and so
        are the names (saved turn, custom id) of the snapshot.
        Returns {session: new head} for the sessions whose head moved. Files are the caller's job."""
        moved: dict[str, str | None] = {}
        with self.tx():
            for sid in ids:
                row = self.one("SELECT parent FROM snapshots WHERE id = ?", (sid,))
                if row is None:
                    continue
                parent = row["parent"]
                self.execute("UPDATE snapshots SET parent = ? WHERE parent = ?", (parent, sid))
                for s in self.rows("SELECT name FROM sessions WHERE head = ?", (sid,)):
                    moved[s["name"]] = parent
                self.execute("UPDATE sessions SET head = ? WHERE head = ?", (parent, sid))
                self.execute("UPDATE sessions SET base = NULL WHERE base = ?", (sid,))
                self.execute("DELETE FROM names WHERE snapshot = ?", (sid,))
                self.execute("DELETE FROM snapshots WHERE id = ?", (sid,))
        return moved

    # -- prefix lookup -------------------------------------------------------------------------------
    def prefix_lengths(self, fingerprint: str, max_tokens: int, session: str | None) -> list[int]:
        sql = "SELECT DISTINCT n_tokens FROM snapshots WHERE fingerprint = ? AND n_tokens BETWEEN 1 AND ?"
        params: list[Any] = [fingerprint, max_tokens]
        if session is not None:
            sql, params = sql + " AND session = ?", params + [session]
        return sorted(r[0] for r in self.rows(sql, params))

    def prefix_candidates(self, fingerprint: str, hashes: dict[str, int], session: str | None) -> list[SnapshotRecord]:
        """Snapshots whose (token hash, length) is one of `hashes`, longest then newest first."""
        found: list[SnapshotRecord] = []
        keys = list(hashes)
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            sql = f"SELECT * FROM snapshots WHERE fingerprint = ? AND token_hash IN ({','.join('?' * len(chunk))})"
            params: list[Any] = [fingerprint, *chunk]
            if session is not None:
                sql, params = sql + " AND session = ?", params + [session]
            found += [_snapshot(r) for r in self.rows(sql, params) if hashes.get(r["token_hash"]) == r["n_tokens"]]
        return sorted(found, key=lambda r: (r.n_tokens, r.id), reverse=True)

    # -- helpers -------------------------------------------------------------------------------------
    def _insert(self, table: str, allowed: tuple[str, ...], fields: dict[str, Any]) -> None:
        bad = set(fields) - set(allowed)
        if bad:
            raise ValueError(f"unknown {table} columns {sorted(bad)}")
        cols = ", ".join(fields)
        self.execute(f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(fields))})", fields.values())

    def _update(self, table: str, allowed: tuple[str, ...], key: str, value: Any, fields: dict[str, Any]) -> None:
        bad = set(fields) - set(allowed)
        if bad or not fields:
            raise ValueError(f"bad {table} update columns {sorted(bad) or '(none)'}")
        sets = ", ".join(f"{c} = ?" for c in fields)
        self.execute(f"UPDATE {table} SET {sets} WHERE {key} = ?", [*fields.values(), value])


def _session(row: sqlite3.Row) -> SessionInfo:
    return SessionInfo(
        name=row["name"],
        fingerprint=row["fingerprint"],
        model_id=row["model_id"],
        head=row["head"],
        base=row["base"],
        created=row["created"],
        last_used=row["last_used"],
        n_messages=int(row["n_messages"]),
        n_snapshots=int(row["n_snapshots"]),
    )


def _snapshot(row: sqlite3.Row) -> SnapshotRecord:
    durable = bool(row["durable"])
    return SnapshotRecord(
        id=row["id"],
        session=row["session"],
        parent=row["parent"],
        n_tokens=int(row["n_tokens"]),
        nbytes=int(row["nbytes"]),
        checksum=row["checksum"],
        fingerprint=row["fingerprint"],
        model_id=row["model_id"],
        n_messages=int(row["n_messages"]),
        created=row["created"],
        last_access=row["last_access"],
        pinned=bool(row["pinned"]),
        label=row["label"],
        durable=durable,
        tiers=("disk",) if durable else (),
    )
