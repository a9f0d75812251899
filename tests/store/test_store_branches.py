"""Branching, reference counting and transcripts."""

from __future__ import annotations

import pytest
from payloads import same_payload

from engramctl.errors import NotFound, UsageError
from engramctl.errors import AlreadyExists

U = lambda text: {"role": "user", "content": text}  # noqa: E731
A = lambda text: {"role": "assistant", "content": text}  # noqa: E731


def test_branch_then_delete_source_and_resume_branch(open_store, make_payload, clock):
    s = open_store(keep_last=1)
    p1, p2 = make_payload(10, 1), make_payload(20, 2)
    a = s.snapshots.commit("main", p1, messages=[U("hi")])
    br = s.sessions.branch(a.id, "side")
    s.snapshots.commit("main", p2, messages=[A("hello"), U("more")])
    s.flush()
    assert br.head == a.id and br.base == a.id and s.transcripts.of_session("side") == [U("hi")]
    s.transcripts.append("side", [A("side reply")])
    s.retention.gc()  # keep_last=1 would drop `a` from main, but the branch needs it
    assert s.snapshots.info(a.id)
    deleted = s.delete_session("main")
    assert a.id not in deleted and len(deleted) == 1
    assert s.snapshots.info(a.id).session == "side"  # ownership moved to the survivor
    s.close()
    s = open_store(keep_last=1)  # and in a fresh process-like reopen
    assert same_payload(s.snapshots.load(s.sessions.get("side").head), p1)
    assert s.transcripts.of_session("side") == [U("hi"), A("side reply")]


def test_branch_from_session_copies_whole_transcript_no_payload(store, make_payload):
    store.snapshots.commit("main", make_payload(10, 1), messages=[U("q")])
    store.transcripts.append("main", [A("reply not yet snapshotted")])
    store.flush()
    files_before = sorted((store.settings.paths.data_dir / "snapshots").iterdir())
    br = store.sessions.branch("main", "copy")
    assert br.head == store.sessions.get("main").head and br.n_messages == 2
    assert sorted((store.settings.paths.data_dir / "snapshots").iterdir()) == files_before
    with pytest.raises(AlreadyExists):
        store.sessions.branch("main", "copy")
    with pytest.raises(NotFound):
        store.sessions.branch("nope", "x")


def test_branches_diverge_without_affecting_each_other(store, make_payload):
    a = store.snapshots.commit("main", make_payload(10, 1), messages=[U("1")])
    store.sessions.branch(a.id, "b")
    store.snapshots.commit("main", make_payload(11, 2), messages=[A("main")])
    store.snapshots.commit("b", make_payload(12, 3), messages=[A("branch")])
    assert store.transcripts.of_session("main") == [U("1"), A("main")]
    assert store.transcripts.of_session("b") == [U("1"), A("branch")]
    assert store.sessions.head("b").parent == a.id
    assert [r.id for r in store.sessions.history("b")] == [a.id, store.sessions.head("b").id]
    # ids, not records: the writer may make a record durable (checksum, size, tiers) between the two reads
    assert len(store.sessions.history("main")) == 2
    assert [r.id for r in store.snapshots.list("b")] == [store.sessions.head("b").id]
    assert store.transcripts.of_snapshot(a.id) == [U("1")]


def test_snapshot_transcript_survives_rewind_and_new_turns(store, make_payload):
    a = store.snapshots.commit("c", make_payload(10, 1), messages=[U("1")])
    b = store.snapshots.commit("c", make_payload(20, 2), messages=[A("2"), U("3")])
    store.sessions.set_head("c", a.id)
    store.transcripts.append("c", [A("different")])
    assert store.transcripts.of_snapshot(b.id) == [U("1"), A("2"), U("3")]
    store.sessions.set_head("c", b.id)
    assert store.transcripts.of_session("c") == [U("1"), A("2"), U("3")]
    assert store.retention.gc().messages_removed == 1  # only "different": no session or snapshot reaches it now


def test_set_and_truncate_transcript(store):
    assert store.transcripts.append("t", [U("a"), A("b")]) == 2
    assert store.transcripts.replace("t", [U("a"), A("b"), U("c")]) == 3  # reuses the common prefix
    assert store.transcripts.truncate("t", 1) == 1
    assert store.transcripts.of_session("t") == [U("a")]
    with pytest.raises(UsageError):
        store.transcripts.truncate("t", 5)
    with pytest.raises(UsageError):
        store.transcripts.append("t", ["not a dict"])
    with pytest.raises(UsageError):
        store.transcripts.append("t", [{"x": float("nan")}])
    assert store.transcripts.of_session("t") == [U("a")]  # failed appends wrote nothing
    assert store.retention.gc().messages_removed == 2


def test_unicode_and_nested_messages_round_trip(store):
    msg = {"role": "assistant", "content": "héllo ✓ \u0000 end", "tool_calls": [{"id": "1", "args": {"k": [1, 2]}}]}
    store.transcripts.append("u", [msg])
    assert store.transcripts.of_session("u") == [msg]


def test_reset_session_starts_over_and_keeps_every_snapshot_and_its_transcript(store, make_payload):
    a = store.snapshots.commit("main", make_payload(10, 1), messages=[U("1")])
    b = store.snapshots.commit("main", make_payload(12, 2), messages=[A("one"), U("2")])
    info = store.sessions.reset("main")
    assert info.head is None and info.n_messages == 0 and info.n_snapshots == 2
    assert store.transcripts.of_session("main") == [] and [r.id for r in store.snapshots.list("main")] == [a.id, b.id]
    store.flush()
    store.retention.gc()  # the old messages stay reachable through the snapshots that were taken at them
    assert store.transcripts.of_snapshot(b.id) == [U("1"), A("one"), U("2")]
    c = store.snapshots.commit("main", make_payload(5, 3), messages=[U("again")])
    assert c.parent is None and store.transcripts.of_session("main") == [U("again")]
    assert store.sessions.history("main") == [store.snapshots.info(c.id)]
    with pytest.raises(NotFound) as e:
        store.sessions.reset("nobody")
    assert e.value.hint == "engramctl sessions"
    with pytest.raises(NotFound) as e:
        store.snapshots.info("0" * 32)
    assert e.value.hint == "engramctl snapshots ls"
