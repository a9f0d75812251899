"""The listing of a store's complete snapshots as `snapshots ls` prints them, read from the index alone.

`listed(index)` returns the rows that the records of `Index.snapshots(session, durable_only=True)` and the CLI's
rows.snapshot_rows make together (a record's fields in its order, then `head_of` and `branch_point_of`: the
sessions whose head, or branch point, the snapshot is, in the order `Index.session_refs` lists sessions), equal
value for value and key for key, at less cost a row: a listing of 10,000 snapshots makes 10,000 of them.

- One read transaction, on a read-only connection of its own through apsw, not the index's sqlite3 one: CPython
  3.11's sqlite3 releases and takes back the GIL around each column value it fetches (three mutexes and a condition
  signal, ~650 instructions a value: at 10,000 snapshots, 150,000 values, the fetch 40% of `snapshots ls --json`),
  apsw once a row, and the connection, used by this one thread, takes no SQLite mutex (NOMUTEX): the fetch in a
  third of the instructions (callgrind). apsw's SQLite (its own, newer than the system's) reads the file the store
  writes; it sees the last committed transaction, as the index's reader does.
- The sessions' heads and bases, then the snapshots' columns it does not know. A listed row is durable, so its
  sizes are the row's own sums (schema 5's block_bytes, shared_block_bytes) without the records' `CASE WHEN
  durable`, and its kind, durable and tiers are constants.
- Each row a copy of one template dict (the keys in the record's order) with its values set in place, as its tuple
  comes from the cursor: a dict display of 21 keys costs about half again as much, and SQLite writing the rows'
  JSON itself (json_object, printf, ||) costs more than Python's dicts and orjson (measured at 10,000 rows).

Only reads: the index may be one opened by Index.read_only (no lock, nothing written); a transaction the index's
own connection has not committed is not seen.
"""

from __future__ import annotations

from engramctl.store.index import RECORD_FIELDS, Index

TYPE_CHECKING = False  # typing's, without importing typing: `snapshots ls` imports none of it (~4% of its time)
if TYPE_CHECKING:
    from typing import Any

# a listed row's keys: a SnapshotRecord's fields in its order, then the CLI's two
_TEMPLATE: dict[str, Any] = dict.fromkeys((*RECORD_FIELDS, "head_of", "branch_point_of"))
_TEMPLATE |= {"durable": True, "kind": "snapshot", "tiers": ("disk",)}  # a row's tuples shared: cli/rows.py
# the unary +: the planner walks the id index (or snapshots_by_session for one session) in id order, no sort
_SELECT = """
    SELECT s.id, s.session, s.parent, s.n_tokens, s.nbytes, s.block_bytes, s.shared_block_bytes, s.checksum,
           s.fingerprint, s.model_id, s.n_messages, s.created, s.last_access, s.pinned, s.label
    FROM snapshots s WHERE +s.kind = 'snapshot' AND +s.durable = 1"""
_SESSIONS = "SELECT name, head, base FROM sessions ORDER BY last_used DESC, name"  # Index.session_refs's order


def listed(index: Index, session: str | None = None) -> list[dict[str, Any]]:
    """The complete snapshots (of `session`, or all), oldest first (by id), as `snapshots ls` lists them."""
    import apsw

    sql, params = _SELECT, ()
    if session is not None:
        sql, params = sql + " AND s.session = ?", (session,)
    rows: list[dict[str, Any]] = []
    db = apsw.Connection(str(index.path), flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_NOMUTEX)
    try:
        db.set_busy_timeout(10_000)  # as the index's own connections wait
        db.execute("BEGIN")  # one read transaction: the sessions and snapshots of one state
        heads, bases = referrers(db.execute(_SESSIONS))
        _make_rows(db.execute(sql + " ORDER BY s.id", params), heads, bases, rows)
    finally:
        db.close()
    return rows


def referrers(sessions: Any) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """The sessions each snapshot is the head of, and the branch point of, in the order of `sessions`: (name, head,
    base) each (cli/rows.py makes a daemon's rows with it too)."""
    heads: dict[str, list[str]] = {}
    bases: dict[str, list[str]] = {}
    for name, head, base in sessions:
        if head:
            heads.setdefault(head, []).append(name)
        if base:
            bases.setdefault(base, []).append(name)
    return {k: tuple(v) for k, v in heads.items()}, {k: tuple(v) for k, v in bases.items()}


def _make_rows(found: Any, heads: dict[str, tuple], bases: dict[str, tuple], rows: list) -> None:
    """Each snapshot's row appended to `rows`, as its tuple comes from the cursor (none kept: 10,000 tuples of 15
    are memory a listing touches for nothing)."""
    add, copy, head_of, base_of = rows.append, _TEMPLATE.copy, heads.get, bases.get
    for sid, name, parent, tokens, own, blocks, shared, checksum, fp, model, msgs, created, seen, pin, label in found:
        row = copy()
        row["id"] = sid
        row["session"] = name
        row["parent"] = parent
        row["n_tokens"] = tokens
        row["nbytes"] = own + blocks
        row["checksum"] = checksum
        row["fingerprint"] = fp
        row["model_id"] = model
        row["n_messages"] = msgs
        row["created"] = created
        row["last_access"] = seen
        row["pinned"] = pin != 0
        row["label"] = label
        row["file_bytes"] = own
        row["own_size_bytes"] = own + blocks - shared
        row["shared_size_bytes"] = shared
        row["head_of"] = head_of(sid, ())
        row["branch_point_of"] = base_of(sid, ())
        add(row)
