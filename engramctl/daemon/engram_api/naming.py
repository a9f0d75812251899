"""The Engram API's selectors and names, read from the store's name table (store/name_table.py) and written
by a save: what `turn_number` / `branch_name` name in a conversation, which state a restore in their terms
goes back to, and a snapshot's metadata in their terms (`answers.Meta`).

`body` is the request (engram_api/schemas.py): its `session_name` is the conversation's session, its
`conversation` the name the client gave, `turn_number` and `branch_name` their selectors.
"""

from __future__ import annotations

from typing import Any

from engramctl.daemon.engram_api import restore
from engramctl.daemon.engram_api.answers import Meta
from engramctl.daemon.service import ConversationService
from engramctl.errors import NotFound
from engramctl.protocol import Snapshot
from engramctl.store.store import Store


def save(
    service: ConversationService,
    store: Store,
    session: str,
    label: str | None,
    pin: bool,
    *,
    turn_number: int | None = None,
    branch_name: str | None = None,
    snapshot_id: str | None = None,
) -> tuple[str, str | None]:
    """/save_snapshot's work, on the worker: the conversation's state saved (restore.py `save`), then
    named as asked: turn N, branch B (a session there), a custom id; else it becomes what a restore in their
    terms goes back to. Returns (snapshot id, the branch's session or None)."""
    sid = restore.save(service, session, label, pin)
    branch = None
    if branch_name is not None:
        branch = store.names.save_branch(session, branch_name, sid).name
    else:
        if turn_number is not None:
            store.names.name_turn(session, turn_number, sid)
        store.names.mark_saved(session, sid)
    if snapshot_id is not None:
        store.names.name_snapshot(snapshot_id, sid)
    return sid, branch


def restore_point(store: Store, session: str) -> str | None:
    """What a restore of a conversation without a selector goes back to in their terms: what it saved last
    (their server restores what a save persisted), None when it saved nothing (then: its head)."""
    return store.names.last_saved(session) if store.sessions.has(session) else None


def not_found(body: Any, turn: int | None = None, branch: str | None = None) -> NotFound:
    """The Engram server's words for a selector that names nothing."""
    return NotFound(f"Snapshot not found: conversation={body.conversation}, turn={turn}, branch={branch}.")


def turn_snapshot(store: Store, body: Any) -> str:
    """The snapshot turn `body.turn_number` of the request's conversation names."""
    name = body.session_name
    sid = store.names.find_turn(name, body.turn_number) if store.sessions.has(name) else None
    if sid is None:
        raise not_found(body, turn=body.turn_number)
    return sid


def branch_session(store: Store, body: Any) -> str:
    """The session that is branch `body.branch_name` of the request's conversation."""
    name = body.session_name
    branch = store.names.branch_session(name, body.branch_name) if store.sessions.has(name) else None
    if branch is None:
        raise not_found(body, turn=body.turn_number, branch=body.branch_name)
    return branch


def head(store: Store, name: str, body: Any) -> str:
    info = store.sessions.get(name)
    if info.head is None:
        if body.branch_name is not None:
            raise not_found(body, branch=body.branch_name)
        raise NotFound(f"session {info.name!r} has no snapshot yet.")
    return info.head


def snapshot(store: Store, sid: str) -> Snapshot:
    return Snapshot.from_record(store.snapshots.info(sid))


def names_of(store: Store, snaps: list[Snapshot]) -> tuple[dict[str, int], dict[str, str]]:
    """For snapshots: the turn each is of its own session (snapshot id -> turn number) and its name in the
    Engram server's terms (the custom id a save gave it, else "<session>-t<turn>" when that names it)."""
    turns: dict[str, int] = {}
    names: dict[str, str] = {}
    tables = store.names.turns_of({s.session for s in snaps})  # a session deleted since the listing: none
    for session in sorted(tables):
        for n, sid in tables[session].items():
            if sid not in turns:
                turns[sid], names[sid] = n, f"{session}-t{n}"
    names.update(store.names.custom_ids([s.id for s in snaps]))
    return turns, names


def meta(
    store: Store,
    sid: str,
    conversation: str | None,
    *,
    scope: str | None = None,
    label: str | None = None,
    branch: str | None = None,
) -> Meta:
    """A snapshot's metadata in the Engram server's terms: its turn within session `scope` (default: its
    own session), which names it "<label>-t<turn>" (label: the conversation_id the client gave, else the
    session), unless a save gave it a custom id. `conversation` is the conversation_id to report."""
    rec = store.snapshots.info(sid)
    scope = scope or rec.session
    turns = store.names.turns(scope) if store.sessions.has(scope) else {}
    turn = next((n for n, s in turns.items() if s == sid), None)
    name = store.names.custom_ids([sid]).get(sid)
    if name is None and turn is not None:
        name = f"{label or scope}-t{turn}"
    if turn is None:
        turn = store.names.turn_numbers([sid]).get(sid)
    return Meta(conversation or scope, turn, branch, name)
