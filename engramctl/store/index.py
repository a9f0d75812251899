"""The SQLite index: one connection in WAL mode, guarded by one re-entrant lock, migrated on open.

Every method takes the lock, so the index is safe to share between the API thread and the writer
thread; `tx()` groups several calls into one atomic transaction (BEGIN IMMEDIATE ... COMMIT).
synchronous=FULL: a committed transaction (a transcript message, say) survives a power cut.
Column names passed to the update helpers come from code, never from users, and are whitelisted.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections import namedtuple
from collections.abc import Iterable, Iterator
from pathlib import Path

from engramctl.errors import EngramError
from engramctl.store.schema import MIGRATIONS

TYPE_CHECKING = False  # typing's, without importing typing: `snapshots ls` imports none of it (~4% of its time)
if TYPE_CHECKING:  # records are imported where one is made: `snapshots ls` reads the index and makes none
    from typing import Any

    from engramctl.store.records import SessionInfo, SnapshotRecord

# a row as reconcile checks it: (durable: bool, file_bytes: int, its own file's size as indexed)
SnapshotState = namedtuple("SnapshotState", ["durable", "file_bytes"])


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
    "kind",
)
BLOCK_COLUMNS = ("id", "fingerprint", "n_tokens", "nbytes", "checksum", "durable")
# a SnapshotRecord's fields, in its order, each as SQL over a snapshots row `s`: the one place a row's bytes become a
# record's (its own file, plus its KV blocks once durable: the sums schema migration 5's triggers keep on the row, so
# no record reads snapshot_blocks). None: made by _fields.
_FIELD_SQL: tuple[tuple[str, str | None], ...] = (
    ("id", "s.id"),
    ("session", "s.session"),
    ("parent", "s.parent"),
    ("n_tokens", "s.n_tokens"),
    ("nbytes", "s.nbytes + (CASE WHEN s.durable <> 0 THEN s.block_bytes ELSE 0 END)"),
    ("checksum", "s.checksum"),
    ("fingerprint", "s.fingerprint"),
    ("model_id", "s.model_id"),
    ("n_messages", "s.n_messages"),
    ("created", "s.created"),
    ("last_access", "s.last_access"),
    ("pinned", "s.pinned"),
    ("label", "s.label"),
    ("durable", "s.durable"),
    ("tiers", None),
    ("file_bytes", "s.nbytes"),
    ("own_size_bytes", "s.nbytes + (CASE WHEN s.durable <> 0 THEN s.block_bytes - s.shared_block_bytes ELSE 0 END)"),
    ("shared_size_bytes", "(CASE WHEN s.durable <> 0 THEN s.shared_block_bytes ELSE 0 END)"),
    ("kind", "s.kind"),
)
RECORD_FIELDS = tuple(name for name, _ in _FIELD_SQL)  # a record's keys in its order (store/listing.py's rows too)
_BLANK = dict.fromkeys(RECORD_FIELDS)  # copied for each row


def _select() -> tuple[str, tuple[str, ...]]:
    """The SQL of a record's fields read from its row, and their names."""
    chosen = [(name, sql) for name, sql in _FIELD_SQL if sql is not None]
    return ", ".join(sql for _, sql in chosen), tuple(name for name, _ in chosen)


_RECORD_SQL, _RECORD_NAMES = _select()
# a snapshot row as _fields() takes it, and its token hash (a prefix lookup compares it; a listing needs none)
_SNAPSHOT_SELECT = f"SELECT {_RECORD_SQL}, s.token_hash AS token_hash FROM snapshots s"
SESSION_COLUMNS = ("name", "fingerprint", "model_id", "head", "base", "tip", "created", "last_used")
# stored_bytes: the session's snapshot files and each KV block they use, a block counted once however many
# of them share it (summing the snapshots' sizes would count a conversation's early blocks once per turn)
_SESSION_SELECT = """
    SELECT s.*, COALESCE(m.depth, 0) AS n_messages, COALESCE(h.n_tokens, 0) AS head_tokens,
           COALESCE(h.durable, 0) AS head_durable,
           (SELECT COUNT(*) FROM snapshots x WHERE x.session = s.name) AS n_snapshots,
           (SELECT COALESCE(SUM(x.nbytes), 0) FROM snapshots x WHERE x.session = s.name)
           + (SELECT COALESCE(SUM(b.nbytes), 0) FROM blocks b WHERE b.id IN (
                SELECT sb.block FROM snapshot_blocks sb JOIN snapshots x ON x.id = sb.snapshot
                WHERE x.session = s.name)) AS stored_bytes
    FROM sessions s LEFT JOIN messages m ON m.id = s.tip LEFT JOIN snapshots h ON h.id = s.head
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
        self._after: list = []  # what to do once the outermost transaction commits (after_commit)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=OFF")  # references are kept by the store (see schema.py)
        # an INSERT OR REPLACE that replaces a snapshot_blocks row fires its delete trigger: the block sums stay exact
        self._db.execute("PRAGMA recursive_triggers=ON")
        self._migrate()

    @classmethod
    def read_only(cls, path: Path) -> Index | None:
        """The index opened only to read it (a listing while no daemon runs): no migration and no pragma that
        writes, no lock file; SQLite shows the last committed transaction, never one in progress. None when
        there is no index yet, or its schema is not this engramctl's (Index() migrates it, or refuses)."""
        path = Path(path)
        if not path.is_file():
            return None
        db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, check_same_thread=False, timeout=10)
        try:
            if db.execute("PRAGMA user_version").fetchone()[0] != len(MIGRATIONS):
                db.close()
                return None
        except BaseException:
            db.close()
            raise
        index = cls.__new__(cls)
        index.path, index.lock, index._db, index._depth, index._after = path, threading.RLock(), db, 0, []
        db.row_factory = sqlite3.Row
        return index

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
                    for statement in _statements(MIGRATIONS[number]):
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
                self._after.clear()
                raise
            else:
                self._db.execute("COMMIT")
            finally:
                self._depth = 0
            after, self._after = self._after, []
            for fn in after:
                fn()

    def after_commit(self, fn) -> None:
        """Run `fn` once the transaction this is called in commits (at once outside one; never if it rolls
        back): a file whose last reference the transaction drops is deleted only once that is durable."""
        with self.lock:
            if self._depth:
                self._after.append(fn)
            else:
                fn()

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

    def session_count(self) -> int:
        return int(self.one("SELECT COUNT(*) FROM sessions")[0])

    def session_refs(self) -> list[tuple[str, str | None, str | None]]:
        """(name, head, base) of every session, in sessions()' order: what a snapshot listing needs of them."""
        return [tuple(r) for r in self.rows("SELECT name, head, base FROM sessions ORDER BY last_used DESC, name")]

    def has_session(self, name: str) -> bool:
        return self.one("SELECT 1 FROM sessions WHERE name = ?", (name,)) is not None

    def session_head(self, name: str) -> str | None:
        row = self.one("SELECT head FROM sessions WHERE name = ?", (name,))
        return None if row is None else row["head"]

    def session_tip(self, name: str) -> int | None:
        row = self.one("SELECT tip FROM sessions WHERE name = ?", (name,))
        return None if row is None else row["tip"]

    # -- snapshots -----------------------------------------------------------------------------------
    def snapshot(self, snapshot_id: str) -> SnapshotRecord | None:
        """The row of a snapshot or a prefix state."""
        row = self.one(_SNAPSHOT_SELECT + " WHERE s.id = ?", (snapshot_id,))
        return None if row is None else _snapshot(row)

    def snapshots(
        self, session: str | None = None, kind: str | None = "snapshot", *, durable_only: bool = False
    ) -> list[SnapshotRecord]:
        """Snapshots by id (oldest first), of one session if given; prefix states with kind="prefix", every
        row with kind=None; durable_only: those whose files are complete."""
        where, params = [], []
        if kind is not None:
            where, params = ["s.kind = ?"], [kind]
        if session is not None:
            where, params = where + ["s.session = ?"], params + [session]
        if durable_only:
            where.append("s.durable = 1")
        sql = _SNAPSHOT_SELECT + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY s.id"
        return [_snapshot(r) for r in self.rows(sql, params)]

    def snapshot_states(self) -> dict[str, SnapshotState]:
        """{id: (durable, own file bytes)} of every row: what reconcile checks against the files, without the
        records' block sums."""
        rows = self.rows("SELECT id, durable, nbytes FROM snapshots")
        return {r["id"]: SnapshotState(bool(r["durable"]), int(r["nbytes"])) for r in rows}

    def ancestry(self, snapshot_id: str) -> list[SnapshotRecord]:
        """The snapshot and its ancestors through `parent`, oldest first."""
        rows = self.rows(
            """WITH RECURSIVE chain(id, n) AS (
                   SELECT id, 0 FROM snapshots WHERE id = ?
                   UNION ALL SELECT s.parent, c.n + 1 FROM snapshots s JOIN chain c ON s.id = c.id
                   WHERE s.parent IS NOT NULL)"""
            + _SNAPSHOT_SELECT
            + " JOIN chain c ON s.id = c.id ORDER BY c.n DESC",
            (snapshot_id,),
        )
        return [_snapshot(r) for r in rows]

    def snapshot_tip(self, snapshot_id: str) -> int | None:
        row = self.one("SELECT tip FROM snapshots WHERE id = ?", (snapshot_id,))
        return None if row is None else row["tip"]

    def ids_with_prefix(self, prefix: str, limit: int = 2) -> list[str]:
        rows = self.rows(
            "SELECT id FROM snapshots WHERE id >= ? AND id < ? AND kind = 'snapshot' ORDER BY id LIMIT ?",
            (prefix, prefix + "g", limit),
        )
        return [r["id"] for r in rows]

    def insert_snapshot(self, **fields: Any) -> None:
        self._insert("snapshots", SNAPSHOT_COLUMNS, fields)

    def update_snapshot(self, snapshot_id: str, **fields: Any) -> None:
        self._update("snapshots", SNAPSHOT_COLUMNS, "id", snapshot_id, fields)

    def durable_bytes(self, kind: str | None = None) -> tuple[int, int]:
        """(bytes on disk, durable rows): every durable file, KV blocks included, each block once (the running
        totals: one row each, whatever the store holds). With `kind` ("prefix"), only that kind's own files and
        the blocks its rows use (summed over that kind's rows)."""
        if kind is None:
            totals = {r["name"]: r for r in self.rows("SELECT name, nbytes, count FROM totals")}
            snaps, blocks = totals["snapshots"], totals["blocks"]
            return int(snaps["nbytes"]) + int(blocks["nbytes"]), int(snaps["count"])
        else:
            row = self.one(
                "SELECT COALESCE(SUM(nbytes), 0), COUNT(*) FROM snapshots INDEXED BY snapshots_by_kind "
                "WHERE durable = 1 AND kind = ?",
                (kind,),
            )
            blocks = self.one(
                "SELECT COALESCE(SUM(nbytes), 0) FROM blocks WHERE durable = 1 AND id IN "
                "(SELECT sb.block FROM snapshot_blocks sb JOIN snapshots s ON s.id = sb.snapshot WHERE s.kind = ?)",
                (kind,),
            )
        return int(row[0]) + int(blocks[0]), int(row[1])

    def referrers(self, snapshot_id: str) -> list[str]:
        """Sessions whose head or branch point is this snapshot, oldest session first."""
        rows = self.rows(
            "SELECT name FROM sessions WHERE head = ? OR base = ? ORDER BY created, name", (snapshot_id, snapshot_id)
        )
        return [r["name"] for r in rows]

    def referenced_among(self, snapshot_ids: Iterable[str]) -> set[str]:
        """Those of these snapshots that are a session's head or branch point (indexed: no scan of sessions)."""
        ids = json.dumps(list(snapshot_ids))
        rows = self.rows(
            "SELECT value AS id FROM json_each(?) WHERE EXISTS (SELECT 1 FROM sessions WHERE head = value) "
            "OR EXISTS (SELECT 1 FROM sessions WHERE base = value)",
            (ids,),
        )
        return {r["id"] for r in rows}

    def eviction_order(self, kind: str | None = None) -> Iterator[tuple[str, int]]:
        """(id, own file bytes) of the durable, unpinned rows no session needs (head or branch point), least
        recently used first, unlabelled before labelled; of one kind if given. Read lazily along the eviction
        index: a caller that needs a few victims reads a few rows. Under the lock, writing nothing until it closed
        the iterator."""
        sql = (
            "SELECT id, nbytes FROM snapshots s INDEXED BY snapshots_by_eviction "
            "WHERE durable = 1 AND pinned = 0 "
            "AND NOT EXISTS (SELECT 1 FROM sessions WHERE head = s.id) "
            "AND NOT EXISTS (SELECT 1 FROM sessions WHERE base = s.id)"
        )
        params: tuple = ()
        if kind is not None:
            sql, params = sql + " AND kind = ?", (kind,)
        cursor = self._db.execute(sql + " ORDER BY (label IS NOT NULL), last_access, id", params)
        try:
            while rows := cursor.fetchmany(64):
                for r in rows:
                    yield r["id"], int(r["nbytes"])
        finally:
            cursor.close()

    def freed_along(self, snapshot_id: str, claimed: dict[str, int]) -> int:
        """The bytes of this snapshot's blocks that deleting it frees, when the snapshots already counted in
        `claimed` ({block id: how many of them use it}) go too; counts it in `claimed`. Reads its blocks with their
        users (blocks.users, schema 5), so a block that thousands of snapshots share costs what the victims do,
        not what its users number."""
        freed = 0
        for r in self.rows(
            "SELECT b.id, b.nbytes, b.users FROM snapshot_blocks sb JOIN blocks b ON b.id = sb.block "
            "WHERE sb.snapshot = ?",
            (snapshot_id,),
        ):
            bid, mine = r["id"], claimed.get(r["id"], 0) + 1
            if r["users"] <= mine:
                freed += int(r["nbytes"])
            claimed[bid] = mine
        return freed

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
            for sid in dict.fromkeys(ids):
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
                self.execute("DELETE FROM snapshot_blocks WHERE snapshot = ?", (sid,))
        return moved

    # -- KV blocks (store/blocks.py) -----------------------------------------------------------------
    def block(self, block_id: str) -> sqlite3.Row | None:
        return self.one("SELECT * FROM blocks WHERE id = ?", (block_id,))

    def blocks(self) -> dict[str, sqlite3.Row]:
        return {r["id"]: r for r in self.rows("SELECT * FROM blocks")}

    def use_blocks(self, snapshot_id: str, block_ids: list[str], fingerprint: str | None, block_tokens: int) -> None:
        """Reference `block_ids` (in token order) from the snapshot: rows for blocks not indexed yet are made
        (durable = 0 until their files are written)."""
        with self.tx():
            for seq, bid in enumerate(block_ids):
                self.execute(
                    "INSERT OR IGNORE INTO blocks (id, fingerprint, n_tokens, nbytes, durable) VALUES (?, ?, ?, 0, 0)",
                    (bid, fingerprint, block_tokens),
                )
                self.execute(
                    "INSERT OR REPLACE INTO snapshot_blocks (snapshot, seq, block) VALUES (?, ?, ?)",
                    (snapshot_id, seq, bid),
                )

    def block_ids_of_all(self, snapshot_ids: Iterable[str]) -> list[str]:
        """The blocks these snapshots use (each once)."""
        rows = self.rows(
            "SELECT DISTINCT block FROM snapshot_blocks WHERE snapshot IN (SELECT value FROM json_each(?))",
            (json.dumps(list(snapshot_ids)),),
        )
        return [r["block"] for r in rows]

    def block_ids_of(self, snapshot_id: str) -> list[str]:
        rows = self.rows("SELECT block FROM snapshot_blocks WHERE snapshot = ? ORDER BY seq", (snapshot_id,))
        return [r["block"] for r in rows]

    def block_users(self, block_id: str) -> list[str]:
        """The snapshots and prefix states that use a block."""
        return [r["snapshot"] for r in self.rows("SELECT snapshot FROM snapshot_blocks WHERE block = ?", (block_id,))]

    def update_block(self, block_id: str, **fields: Any) -> None:
        self._update("blocks", BLOCK_COLUMNS, "id", block_id, fields)

    def bytes_freed_by(self, snapshot_ids: list[str]) -> int:
        """What deleting these rows together would free: their own files and the blocks only they use."""
        ids = json.dumps(list(snapshot_ids))
        own = self.one(
            "SELECT COALESCE(SUM(nbytes), 0) FROM snapshots WHERE id IN (SELECT value FROM json_each(?))", (ids,)
        )
        blocks = self.one(
            """SELECT COALESCE(SUM(b.nbytes), 0) FROM blocks b
               WHERE b.id IN (SELECT block FROM snapshot_blocks WHERE snapshot IN (SELECT value FROM json_each(?)))
                 AND NOT EXISTS (SELECT 1 FROM snapshot_blocks o WHERE o.block = b.id
                                 AND o.snapshot NOT IN (SELECT value FROM json_each(?)))""",
            (ids, ids),
        )
        return int(own[0]) + int(blocks[0])

    def drop_unused_blocks(self, among: Iterable[str] | None = None) -> list[tuple[str, int]]:
        """Delete the rows of blocks no snapshot uses, of those `among` (the blocks of the rows a removal just
        deleted: indexed lookups, what it frees) or of all of them (reconcile); returns their (id, bytes)."""
        unused = "NOT EXISTS (SELECT 1 FROM snapshot_blocks sb WHERE sb.block = blocks.id)"
        with self.tx():
            if among is None:
                rows = self.rows(f"SELECT id, nbytes FROM blocks WHERE {unused}")
            else:
                rows = self.rows(
                    f"SELECT id, nbytes FROM blocks WHERE id IN (SELECT value FROM json_each(?)) AND {unused}",
                    (json.dumps(sorted(set(among))),),
                )
            for r in rows:
                self.execute("DELETE FROM blocks WHERE id = ?", (r["id"],))
        return [(r["id"], int(r["nbytes"])) for r in rows]

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


def _statements(script: str) -> Iterator[str]:
    """A migration's statements, one at a time (a trigger's body holds semicolons of its own)."""
    statement = ""
    for piece in script.split(";"):
        statement += piece + ";"
        if sqlite3.complete_statement(statement):
            if statement.strip(" \n;"):
                yield statement
            statement = ""
    if statement.strip(" \n;"):
        raise ValueError(f"an incomplete statement in a migration: {statement[:80]!r}")


def _session(row: sqlite3.Row) -> SessionInfo:
    from engramctl.store.records import SessionInfo

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
        stored_bytes=int(row["stored_bytes"]),
        head_tokens=int(row["head_tokens"]),
        head_tiers=("disk",) if row["head_durable"] else (),  # a memory tier is the store's to add (core.py)
    )


def _fields(v: tuple, names: tuple[str, ...] = _RECORD_NAMES, blank: dict[str, Any] = _BLANK) -> dict[str, Any]:
    """A SnapshotRecord's fields (tiers a list) from a row of _SNAPSHOT_SELECT (or of the columns `names`, the rest
    in `blank`): what _FIELD_SQL cannot make (SQLite has no booleans), at the least Python a row: a listing makes
    thousands."""
    d = blank.copy()
    d.update(zip(names, v))
    durable = d["durable"] = d["durable"] != 0
    d["pinned"] = d["pinned"] != 0
    d["tiers"] = ["disk"] if durable else []
    return d


def _snapshot(row: sqlite3.Row) -> SnapshotRecord:
    from engramctl.store.records import SnapshotRecord

    fields = _fields(tuple(row))
    fields["tiers"] = tuple(fields["tiers"])
    return SnapshotRecord(**fields)
