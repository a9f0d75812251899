"""The Engram API's names for snapshots: turn numbers, branch names, custom snapshot ids, the latest save
(a Store part: `store.names`, over the index's `names` table).

The Engram server keeps one file per (conversation, turn number) and one per (conversation, branch name),
overwritten by the next save of the same selector, and answers a save with "<conversation_id>-t<turn>"
or the client's own snapshot_id. Here every snapshot keeps its unique id; these are names on top of
them, kept in the index (schema migration 2). Nothing is copied:

- turn N of a session: the snapshot a save named turn N (the newest such save), else the snapshot that
  ends the session's N-th user turn (its transcript holds N user messages and ends with a reply; the
  prompt snapshot in the middle of a turn ends none): the one on the session's current line (its head's
  ancestry) first, else the newest it owns. Turns count from 1: turn 1 is the state after the first
  reply, as the Engram guide saves it; turn 0 exists only when a save names it.
- branch B of a session: a session of its own (as Sessions.branch makes: head and branch point shared, not
  copied), named "<session>.<B>" where that is free (names.branch_session_name). Saving B again moves it.
- a custom snapshot id: a store-wide name for one snapshot. Saving it again moves it.
- the latest save of a session: what /save_snapshot saved last, which a restore in the Engram API's terms
  (a conversation, no selector) goes back to, as the original server restores what it saved.

Store.resolve accepts a custom id and "<conversation_id>-t<N>" wherever it accepts a snapshot id.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Iterable

from engramctl.errors import InvalidName, NotFound
from engramctl.store.core import StoreCore
from engramctl.store.sessions import Sessions
from engramctl.errors import AlreadyExists
from engramctl.store.names import (
    branch_session_name,
    is_snapshot_id,
    parse_turn_ref,
    session_for_conversation,
    validate_engram_api_name,
    validate_session_name,
)
from engramctl.store.records import SessionInfo

# (snapshot, user messages in its transcript, role of its last message), for a set of snapshots: its tip's
_TURNS_SQL = """
    SELECT s.id AS snap, m.users AS users, m.role AS last_role
    FROM snapshots s JOIN messages m ON m.id = s.tip WHERE s.id IN ({marks})
"""


# of the sessions named in the JSON array ?1: those that exist
_KNOWN = "SELECT name FROM sessions WHERE name IN (SELECT value FROM json_each(?1))"
# each session's line: its head and the head's ancestors through `parent`, oldest first (Index.ancestry's order)
_LINES = """
    WITH RECURSIVE line(session, id, n) AS (
        SELECT s.name, s.head, 0 FROM sessions s
        WHERE s.head IS NOT NULL AND s.name IN (SELECT value FROM json_each(?1))
        UNION ALL SELECT l.session, p.parent, l.n + 1 FROM line l JOIN snapshots p ON p.id = l.id
        WHERE p.parent IS NOT NULL
    )
    SELECT l.session AS session, l.id AS id FROM line l JOIN snapshots x ON x.id = l.id ORDER BY l.session, l.n DESC
"""
# the snapshots each session owns, by id (Index.snapshots(session)'s order)
_OWNED = """
    SELECT s.session AS session, s.id AS id FROM snapshots s
    WHERE s.kind = 'snapshot' AND s.session IN (SELECT value FROM json_each(?1)) ORDER BY s.session, s.id
"""
# the turns saves named, oldest save first
_SAVED = """
    SELECT n.scope AS scope, n.name AS name, n.snapshot AS snapshot FROM names n JOIN snapshots s ON s.id = n.snapshot
    WHERE n.kind = 'turn' AND n.scope IN (SELECT value FROM json_each(?1)) ORDER BY n.created
"""


class NameTable:
    def __init__(self, core: StoreCore, sessions: Sessions):
        self._core, self._sessions = core, sessions

    # -- turns ---------------------------------------------------------------------------------------
    def turn_numbers(self, snapshot_ids: Iterable[str]) -> dict[str, int]:
        """The user turn each snapshot ends: the number of user messages in its transcript, for the
        snapshots whose transcript ends with a reply (the others are left out)."""
        rows = self._rows_for(_TURNS_SQL, snapshot_ids)
        return {r["snap"]: int(r["users"]) for r in rows if r["last_role"] == "assistant" and r["users"]}

    def turns(self, session: str) -> dict[int, str]:
        """turn number -> snapshot id, for every turn of the session that has one (see the module doc)."""
        tables = self.turns_of([validate_session_name(session)])
        if session not in tables:
            self._sessions.get(session)  # NotFound, in its words
        return tables.get(session, {})

    def turns_of(self, sessions: Iterable[str]) -> dict[str, dict[int, str]]:
        """turns() of each of `sessions` that exists, in five queries, not five per session: a listing of every
        snapshot names each of a thousand sessions' turns."""
        names = (json.dumps(sorted(set(sessions))),)
        with self._core.lock:  # the heads read with the rest: a delete between would leave one dangling
            self._core.check_open()
            index = self._core.index
            known = [r["name"] for r in index.rows(_KNOWN, names)]
            lines, owned, saved = index.rows(_LINES, names), index.rows(_OWNED, names), index.rows(_SAVED, names)
            ended = self.turn_numbers([r["id"] for r in owned] + [r["id"] for r in lines])
        order: dict[str, list[str]] = {name: [] for name in known}
        for r in owned + lines:  # each session's own snapshots (by id), then its line (oldest first)
            order[r["session"]].append(r["id"])
        # a turn ended twice: the last of that order (the line wins, then the newest); a save's name over both
        tables = {name: {ended[sid]: sid for sid in ids if sid in ended} for name, ids in order.items()}
        for r in saved:
            if r["scope"] in tables:
                tables[r["scope"]][int(r["name"])] = r["snapshot"]
        return {name: dict(sorted(table.items())) for name, table in tables.items()}

    def find_turn(self, session: str, turn: int) -> str | None:
        return self.turns(session).get(int(turn))

    def turn_snapshot(self, conversation_id: str, turn: int) -> str:
        """The snapshot "<conversation_id>-t<turn>" names; NotFound, in the Engram server's words, if none."""
        session = session_for_conversation(conversation_id)
        if not self._sessions.has(session):
            raise NotFound(
                f"Snapshot not found: conversation={conversation_id}, turn={turn}, branch=None "
                f"(no conversation {conversation_id!r})."
            )
        sid = self.find_turn(session, turn)
        if sid is None:
            raise NotFound(f"Snapshot not found: conversation={conversation_id}, turn={turn}, branch=None.")
        return sid

    def name_turn(self, session: str, turn: int, snapshot_id: str) -> None:
        """Name `snapshot_id` turn `turn` of `session` (a later save of the same turn moves the name)."""
        if int(turn) < 0:
            raise ValueError("a turn number is >= 0")
        self._name("turn", validate_session_name(session), str(int(turn)), snapshot_id)

    # -- custom snapshot ids -------------------------------------------------------------------------
    def name_snapshot(self, name: str, snapshot_id: str) -> None:
        """Give `snapshot_id` a custom id, usable wherever a snapshot id is (a later save moves it)."""
        validate_engram_api_name(name, "snapshot_id")
        if is_snapshot_id(name):
            raise InvalidName(f"a custom snapshot_id cannot look like a snapshot's own id ({name!r}).")
        self._name("id", "", name, snapshot_id)

    def named(self, name: str) -> str | None:
        """The snapshot a custom id names, if any."""
        return self._snapshot("id", "", name)

    def custom_ids(self, snapshot_ids: Iterable[str]) -> dict[str, str]:
        """snapshot id -> the newest custom id naming it, for those that have one."""
        sql = "SELECT snapshot, name FROM names WHERE kind = 'id' AND snapshot IN ({marks}) ORDER BY created"
        return {r["snapshot"]: r["name"] for r in self._rows_for(sql, snapshot_ids)}

    def is_snapshot_name(self, ref: str) -> bool:
        """Whether `ref` is a custom snapshot id, or "<conversation_id>-t<N>" of a conversation that exists
        (Store.resolve then gives the snapshot, or NotFound when that conversation has no turn N)."""
        if self.named(ref) is not None:
            return True
        turn = parse_turn_ref(ref)
        return turn is not None and self._sessions.has(session_for_conversation(turn[0]))

    # -- branches ------------------------------------------------------------------------------------
    def save_branch(self, session: str, branch: str, snapshot_id: str) -> SessionInfo:
        """Make branch `branch` of `session` a session at `snapshot_id`: a new one the first time (named by
        names.branch_session_name), the same one moved there afterwards. Its transcript is the snapshot's."""
        validate_session_name(session)
        validate_engram_api_name(branch, "branch_name")
        with self._core.lock, self._core.index.tx():
            self._core.check_open()
            snap = self._core.row(snapshot_id)
            tip, now = self._core.index.snapshot_tip(snap.id), self._core.clock()
            fields = dict(
                head=snap.id, base=snap.id, tip=tip, fingerprint=snap.fingerprint, model_id=snap.model_id, last_used=now
            )
            name = self.branch_session(session, branch)
            if name is not None:
                self._core.index.update_session(name, **fields)
                return self._core.index.session(name)  # type: ignore[return-value]
            name = branch_session_name(session, branch)
            if self._core.index.session(name) is not None:
                name = branch_session_name(session, branch, taken=True)
                if self._core.index.session(name) is not None:
                    raise AlreadyExists(f"session {name!r} already exists; cannot make branch {branch!r} there.")
            self._core.index.insert_session(name=name, created=now, **fields)
            self._core.index.execute(
                "INSERT OR REPLACE INTO names (kind, scope, name, snapshot, session, created) "
                "VALUES ('branch', ?, ?, NULL, ?, ?)",
                (session, branch, name, now),
            )
            return self._core.index.session(name)  # type: ignore[return-value]

    def branch_session(self, session: str, branch: str) -> str | None:
        """The session that is branch `branch` of `session`, if there is one."""
        with self._core.lock:
            self._core.check_open()
            row = self._core.index.one(
                "SELECT n.session FROM names n JOIN sessions s ON s.name = n.session "
                "WHERE n.kind = 'branch' AND n.scope = ? AND n.name = ?",
                (session, branch),
            )
        return None if row is None else row["session"]

    def branches(self, session: str) -> dict[str, str]:
        """branch name -> its session, for the branches of `session`, by name."""
        with self._core.lock:
            self._core.check_open()
            rows = self._core.index.rows(
                "SELECT n.name, n.session FROM names n JOIN sessions s ON s.name = n.session "
                "WHERE n.kind = 'branch' AND n.scope = ? ORDER BY n.name",
                (session,),
            )
        return {r["name"]: r["session"] for r in rows}

    # -- the latest save -----------------------------------------------------------------------------
    def mark_saved(self, session: str, snapshot_id: str) -> None:
        """Record `snapshot_id` as what /save_snapshot saved last for `session` (a later save replaces it)."""
        self._name("saved", validate_session_name(session), "", snapshot_id)

    def last_saved(self, session: str) -> str | None:
        """What the session's latest save saved, if that snapshot still exists."""
        return self._snapshot("saved", session, "")

    def forget_session(self, session: str) -> None:
        """Drop the names a session holds (its turns, branches, latest save) and the branch name naming it."""
        with self._core.lock:
            self._core.index.execute("DELETE FROM names WHERE scope = ? OR session = ?", (session, session))

    # -- helpers -------------------------------------------------------------------------------------
    def _rows_for(self, sql: str, snapshot_ids: Iterable[str]) -> list[sqlite3.Row]:
        """`sql`'s rows for these snapshots, 500 ids at a time (SQLite's limit on parameters); `{marks}` in
        `sql` stands for the placeholders. A snapshot's rows all come from one query, in its order."""
        ids = list(dict.fromkeys(snapshot_ids))
        rows: list[sqlite3.Row] = []
        with self._core.lock:
            self._core.check_open()
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                rows += self._core.index.rows(sql.format(marks=",".join("?" * len(chunk))), chunk)
        return rows

    def _snapshot(self, kind: str, scope: str, name: str) -> str | None:
        with self._core.lock:
            self._core.check_open()
            row = self._core.index.one(
                "SELECT snapshot FROM names WHERE kind = ? AND scope = ? AND name = ?", (kind, scope, name)
            )
        return None if row is None else row["snapshot"]

    def _name(self, kind: str, scope: str, name: str, snapshot_id: str) -> None:
        with self._core.lock, self._core.index.tx():
            self._core.check_open()
            sid = self._core.row(snapshot_id).id
            self._core.index.execute(
                "INSERT OR REPLACE INTO names (kind, scope, name, snapshot, session, created) "
                "VALUES (?, ?, ?, ?, NULL, ?)",
                (kind, scope, name, sid, self._core.clock()),
            )
