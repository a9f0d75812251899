"""The Engram API's names in the store (store/name_table.py, `store.names`): turns counted from the
transcript, saved turn names, custom ids, branch sessions, the latest save; Store.resolve accepting them;
the names going with what they name; an index written before they existed opening and gaining them."""

from __future__ import annotations

import sqlite3

import pytest

from engramctl.errors import InvalidName, NotFound, UsageError
from engramctl.store.index import Index
from engramctl.store.names import branch_session_name, parse_turn_ref, session_for_conversation
from engramctl.store.schema import MIGRATIONS
from tests.store.checks import index_of_schema

U = {"role": "user", "content": "q"}
A = {"role": "assistant", "content": "a"}


def _turn(store, make_payload, session: str, n: int, seed: int):
    """A chat turn as the daemon records it: the prompt snapshot, then the reply snapshot."""
    prompt = store.snapshots.commit(session, make_payload(n, seed), messages=[U])
    reply = store.snapshots.commit(session, make_payload(n + 2, seed + 1), messages=[A])
    return prompt, reply


def test_turns_count_user_turns_and_skip_prompt_snapshots(store, make_payload):
    store.snapshots.commit("c", make_payload(3, 0), messages=[{"role": "system", "content": "s"}])
    _, r1 = _turn(store, make_payload, "c", 5, 1)
    _, r2 = _turn(store, make_payload, "c", 9, 3)
    assert store.names.turns("c") == {1: r1.id, 2: r2.id}
    # back to turn 1 and another turn 2: the current line's turn 2 wins; the old one is still turn 2 of
    # nothing else, and stays reachable by its own id
    store.sessions.set_head("c", r1.id)
    _, r2b = _turn(store, make_payload, "c", 9, 5)
    assert store.names.turns("c") == {1: r1.id, 2: r2b.id}
    store.sessions.set_head("c", r1.id)  # rewound again: turn 2 is the newest the conversation owns
    assert store.names.turns("c") == {1: r1.id, 2: r2b.id}
    assert store.resolve("c-t2") == r2b.id and store.resolve("c-t1") == r1.id
    with pytest.raises(NotFound, match="turn=3"):
        store.resolve("c-t3")


def test_saved_turn_names_win_and_move(store, make_payload):
    _, r1 = _turn(store, make_payload, "c", 5, 1)
    store.names.name_turn("c", 0, r1.id)  # a client counting from 0
    _, r2 = _turn(store, make_payload, "c", 9, 3)
    assert store.names.turns("c") == {0: r1.id, 1: r1.id, 2: r2.id}
    store.names.name_turn("c", 1, r2.id)  # the client's turn 1 is our second one
    assert store.names.find_turn("c", 1) == r2.id and store.resolve("c-t1") == r2.id
    store.snapshots.delete(r2.id, force=True)  # the name goes with the snapshot
    assert store.names.find_turn("c", 1) == r1.id


def test_custom_ids_resolve_everywhere_and_go_with_their_snapshot(store, make_payload):
    _, r1 = _turn(store, make_payload, "c", 5, 1)
    store.names.name_snapshot("keep-this.1", r1.id)
    assert store.resolve("keep-this.1") == r1.id and store.names.custom_ids([r1.id]) == {r1.id: "keep-this.1"}
    assert (
        store.names.is_snapshot_name("keep-this.1")
        and store.names.is_snapshot_name("c-t9")
        and not store.names.is_snapshot_name("x")
    )
    for bad in ("a/b", "x" * 256, r1.id):
        with pytest.raises(InvalidName):
            store.names.name_snapshot(bad, r1.id)
    store.snapshots.delete(r1.id, force=True)
    assert store.names.named("keep-this.1") is None
    with pytest.raises(UsageError):
        store.resolve("keep-this.1")


def test_branches_are_sessions_sharing_the_snapshot_and_move_when_saved_again(store, make_payload):
    _, r1 = _turn(store, make_payload, "c", 5, 1)
    info = store.names.save_branch("c", "alt", r1.id)
    assert info.name == "c.alt" and info.head == info.base == r1.id and info.n_messages == 2
    _, r2 = _turn(store, make_payload, "c", 9, 3)
    assert store.names.save_branch("c", "alt", r2.id).name == "c.alt"
    assert store.sessions.get("c.alt").head == r2.id and store.names.branches("c") == {"alt": "c.alt"}
    store.sessions.create("c.other")  # a session of that name already exists: the branch gets another name
    other = store.names.save_branch("c", "other", r1.id)
    assert other.name == branch_session_name("c", "other", taken=True) != "c.other"
    store.delete_session("c.alt")
    assert store.names.branch_session("c", "alt") is None and store.names.branches("c") == {"other": other.name}
    store.delete_session("c")  # the conversation's names go with it
    assert store.names.branches("c") == {}


def test_conversation_ids_up_to_255_characters_map_to_session_names():
    assert session_for_conversation("chat-1") == "chat-1"
    long = "a" * 255
    name = session_for_conversation(long)
    assert len(name) == 64 and name != session_for_conversation("a" * 254) and name.startswith("a" * 47)
    for bad in ("a" * 256, "a/b", "..", "", None):
        with pytest.raises(InvalidName):
            session_for_conversation(bad)
    assert parse_turn_ref("my-chat-t2-t3") == ("my-chat-t2", 3) and parse_turn_ref("chat") is None


def test_an_index_from_before_the_names_opens_and_gains_them(tmp_path):
    path = tmp_path / "index.sqlite"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0])
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO sessions (name, created, last_used) VALUES ('old', 1.0, 1.0)")
    db.commit()
    db.close()
    idx = Index(path)
    try:
        assert idx.schema_version == len(MIGRATIONS) >= 2
        assert idx.session("old") is not None
        assert idx.rows("SELECT * FROM names") == []
    finally:
        idx.close()


def _walked(rows: dict[int, tuple[int | None, str]], tip: int) -> int:
    """The user messages on the chain ending at `tip`, walked up through the parents that exist."""
    users = 0
    while tip in rows:
        parent, role = rows[tip]
        users += role == "user"
        tip = parent
    return users


def test_an_index_of_schema_5_gains_each_messages_role_and_user_count(tmp_path):
    """Migration 6 counts each message's user messages (the chain up to it) over a tree of transcripts with
    branches and a message whose parent is gone; messages added afterwards are counted by its trigger."""
    import json
    import random

    path = tmp_path / "index.db"
    db = index_of_schema(path, 5)
    rng = random.Random(3)
    rows: dict[int, tuple[int | None, str]] = {}
    for n in range(1, 120):
        parent = None if n == 1 or rng.random() < 0.05 else rng.choice(list(rows)[-3:])  # long chains, branching
        role = rng.choice(("user", "assistant", "system", "tool"))
        depth = (
            1 if parent is None else db.execute("SELECT depth FROM messages WHERE id = ?", (parent,)).fetchone()[0] + 1
        )
        db.execute(
            "INSERT INTO messages (id, parent, depth, body) VALUES (?, ?, ?, ?)",
            (n, parent, depth, json.dumps({"role": role, "content": "x"})),
        )
        rows[n] = (parent, role)
    db.execute("DELETE FROM messages WHERE id = 5")  # a transcript cut: its children count from themselves
    del rows[5]
    db.close()
    idx = Index(path)
    try:
        assert idx.schema_version == len(MIGRATIONS) >= 6
        for body in ({"role": "user", "content": "y"}, {"role": "assistant", "content": "z"}):  # after: the trigger
            parent = rng.choice(list(rows))
            cur = idx.execute("INSERT INTO messages (parent, depth, body) VALUES (?, 1, ?)", (parent, json.dumps(body)))
            rows[cur.lastrowid] = (parent, body["role"])
        got = {r["id"]: (r["users"], r["role"]) for r in idx.rows("SELECT id, users, role FROM messages")}
        assert got == {n: (_walked(rows, n), role) for n, (_, role) in rows.items()}
        assert max(users for users, _ in got.values()) > 3
    finally:
        idx.close()


def test_the_latest_save_is_remembered_until_its_snapshot_or_session_goes(store, make_payload):
    (_, r1), (_, r2) = _turn(store, make_payload, "c", 4, 0), _turn(store, make_payload, "c", 8, 2)
    assert store.names.last_saved("c") is None
    store.names.mark_saved("c", r1.id)
    store.names.mark_saved("c", r2.id)  # a later save replaces it
    assert store.names.last_saved("c") == r2.id
    store.snapshots.delete(r2.id, force=True)  # the name goes with the snapshot
    assert store.names.last_saved("c") is None
    store.names.mark_saved("c", r1.id)
    store.delete_session("c")
    assert store.names.last_saved("c") is None
    with pytest.raises(NotFound):
        store.names.mark_saved("c", "0" * 32)


def _turns_one_by_one(store, session: str) -> dict[int, str]:
    """The rule as turns() read it before turns_of, one session at a time: its own snapshots by id, then its
    head's ancestry, each turn to the last of them that ends it, then the saves' names over both."""
    index = store._core.index
    head = store.sessions.get(session).head
    ids = [r.id for r in index.snapshots(session)] + ([r.id for r in index.ancestry(head)] if head else [])
    ended = store.names.turn_numbers(ids)
    table = {ended[sid]: sid for sid in ids if sid in ended}
    saved = index.rows(
        "SELECT n.name, n.snapshot FROM names n JOIN snapshots s ON s.id = n.snapshot "
        "WHERE n.kind = 'turn' AND n.scope = ? ORDER BY n.created",
        (session,),
    )
    table.update({int(r["name"]): r["snapshot"] for r in saved})
    return dict(sorted(table.items()))


def test_the_turns_of_many_sessions_at_once_are_each_ones_turns(store, make_payload):
    """turns_of (a listing's names for a thousand sessions) against the one-session rule, over conversations
    with rewinds, branches (a line through another session's snapshots), saved names and deletions."""
    import random

    rng = random.Random(7)
    replies: list[str] = []
    for step in range(60):
        name = f"c{rng.randrange(5)}"
        move = rng.random()
        store.flush()  # the writer's retention (keep_last) done: the replies left are those it kept
        replies = [r for r in replies if store._core.index.snapshot(r)]
        if move < 0.55 or not replies:
            replies.append(_turn(store, make_payload, name, 4 + step % 7, step)[1].id)
        elif move < 0.7 and store.sessions.has(name):
            store.sessions.set_head(name, rng.choice(replies))  # a rewind, or a jump to another's snapshot
        elif move < 0.8:
            branch = f"b{step}"
            store.sessions.branch(rng.choice(replies), branch)
            replies.append(_turn(store, make_payload, branch, 6, 100 + step)[1].id)
        elif move < 0.9 and store.sessions.has(name):
            store.names.name_turn(name, rng.randrange(4), rng.choice(replies))
        else:
            gone = replies.pop(rng.randrange(len(replies)))
            store.snapshots.delete(gone, force=True)
    store.flush()
    names = [s.name for s in store.sessions.list()]
    got = store.names.turns_of([*names, "no-such-session"])
    assert got == {name: _turns_one_by_one(store, name) for name in names}
    assert sum(len(t) for t in got.values()) > 20 and any(len(t) > 3 for t in got.values())
    assert all(store.names.turns(name) == got[name] for name in names)
    # each snapshot's turn as its transcript reads: the user messages in it, when it ends with a reply
    ids = [r["id"] for r in store._core.index.rows("SELECT id FROM snapshots WHERE tip IS NOT NULL")]
    walked = {}
    for sid in ids:
        said = store.transcripts.of_snapshot(sid)
        users = sum(m["role"] == "user" for m in said)
        if users and said[-1]["role"] == "assistant":
            walked[sid] = users
    assert store.names.turn_numbers(ids) == walked and len(walked) > 20
    with pytest.raises(NotFound):
        store.names.turns("no-such-session")
