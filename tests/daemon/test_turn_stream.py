"""A streamed turn's end on the wire (issue 18): the chunk with the finish_reason goes out as soon as
generation stops, and the recorded turn's `engram` object (its snapshot id) in a trailing chunk with no
choices, then [DONE]. Real HTTP (an in-process daemon on the tiny model), read with the official openai
client; the store's commit of the reply snapshot is held back to prove the finish does not wait for it."""

from __future__ import annotations

import threading

import pytest

TOKEN = "turn-stream-token"


@pytest.fixture
def daemon(tiny_engine, engram_home):
    from tests.helpers.inprocess import InProcessDaemon

    with InProcessDaemon(tiny_engine("transformers"), api_key=TOKEN) as d:
        yield d


def _oai(d):
    import openai

    return openai.OpenAI(base_url=d.url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)


def _slowed_reply_commit(monkeypatch, d, hold_s: float) -> tuple[threading.Event, threading.Event]:
    """The store's commit of a reply snapshot waits for `release` (at most hold_s); returns (release,
    committed). The prompt snapshot's commit (no assistant message yet) is not held."""
    snapshots = d.store.snapshots
    real = snapshots.commit
    release, committed = threading.Event(), threading.Event()

    def commit(session, payload, *, parent=None, messages=None, **kw):
        reply = any(m.get("role") == "assistant" for m in messages or ())
        if reply:
            release.wait(hold_s)
        rec = real(session, payload, parent=parent, messages=messages, **kw)
        if reply:
            committed.set()
        return rec

    monkeypatch.setattr(snapshots, "commit", commit)
    return release, committed


def test_the_finish_chunk_goes_out_before_the_reply_snapshot_is_committed(daemon, monkeypatch):
    release, committed = _slowed_reply_commit(monkeypatch, daemon, hold_s=8.0)
    stream = _oai(daemon).chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Tell me something."}],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"session": "early-finish"},
    )
    chunks, committed_at_finish = [], None
    for chunk in stream:
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].finish_reason:
            committed_at_finish = committed.is_set()
            release.set()  # let the recording go on
    assert committed_at_finish is False  # the finish arrived while the reply snapshot's commit was held

    first, *middle, finish, trailer = chunks
    assert first.choices[0].delta.role == "assistant"
    assert first.model_extra["engram"]["session"] == "early-finish"
    assert first.model_extra["engram"]["snapshot_id"] is None
    assert all(c.choices and c.choices[0].finish_reason is None for c in middle)
    assert finish.choices[0].finish_reason in ("stop", "length") and "engram" not in (finish.model_extra or {})
    assert trailer.choices == [] and trailer.usage.completion_tokens > 0
    engram = trailer.model_extra["engram"]
    assert (
        engram["finish_reason"] in ("stop", "length") and engram["completion_tokens"] == trailer.usage.completion_tokens
    )
    assert engram["snapshot_id"] == daemon.store.sessions.get("early-finish").head
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert daemon.store.transcripts.of_session("early-finish")[-1]["content"] == text


def test_without_usage_the_trailing_chunk_carries_the_engram_alone(daemon):
    stream = _oai(daemon).chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=3,
        temperature=0,
        stream=True,
        extra_body={"session": "no-usage"},
    )
    *_, finish, trailer = list(stream)
    assert finish.choices[0].finish_reason in ("stop", "length")
    assert trailer.choices == [] and trailer.usage is None
    assert trailer.model_extra["engram"]["snapshot_id"] == daemon.store.sessions.get("no-usage").head


def test_the_chat_link_reads_the_snapshot_id_from_the_trailing_chunk(daemon):
    """`engramctl chat`'s link (cli/chatlink.py over client/stream.py) still gets the turn's snapshot id,
    though the finish came before it."""
    from engramctl.cli.chatlink import DaemonChatLink
    from engramctl.client.api import Client

    link = DaemonChatLink(Client(base_url=daemon.url, token=TOKEN, autostart=False), daemon.engine.info.model_id, None)
    try:
        events = list(link.stream("linked", [{"role": "user", "content": "Hi"}], {"max_tokens": 3, "temperature": 0}))
        head = daemon.store.sessions.get("linked").head
        assert events[0]["type"] == "start" and events[0]["engram"]["snapshot_id"] is None
        done = events[-1]
        assert done["type"] == "done" and done["finish_reason"] in ("stop", "length")
        assert done["engram"]["snapshot_id"] == head and head is not None
        assert link.head("linked")["id"] == head
    finally:
        link.close()
