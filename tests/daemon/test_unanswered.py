"""A session whose last user message never got its reply: the daemon was killed mid-reply, or the session
was branched (or restored) at a turn's prompt snapshot. Asking that message again answers it from the state
that holds it (nothing computed, no second copy in the transcript); another message keeps it and continues
from the state before it rather than re-reading the whole conversation. Through the real HTTP interface (an
in-process daemon on the tiny model) with the official openai client."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.helpers.inprocess import InProcessDaemon

FIRST, SECOND = "Hello there.", "Tell me more."


@pytest.fixture
def daemon(tiny_engine, engram_home):
    with InProcessDaemon(tiny_engine("transformers")) as d:
        yield d


def _turn(oai: openai.OpenAI, session: str, content: str):
    return oai.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": content}],
        temperature=0,
        max_tokens=6,
        extra_body={"session": session},
    )


def _left_unanswered(oai: openai.OpenAI, h: httpx.Client, session: str) -> tuple[str, dict]:
    """Two turns on "s", then `session` branched at the second turn's prompt snapshot: the state and
    transcript of a turn whose reply never came. Returns the reply "s" got, and that prompt snapshot."""
    _turn(oai, "s", FIRST)
    reply = _turn(oai, "s", SECOND).choices[0].message.content
    snaps = h.post("/list_snapshots", json={"session": "s"}).json()["snapshots"]
    (prompt,) = [x for x in snaps if x["n_messages"] == 3]  # user, assistant, user: the state awaits a reply
    r = h.post("/restore_snapshot", json={"snapshot_id": prompt["snapshot_id"], "session": session})
    assert r.status_code == 200, r.text
    messages = h.get(f"/v1/sessions/{session}").json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    return reply, prompt


def test_asking_the_unanswered_message_again_answers_it_from_the_state_that_holds_it(daemon):
    oai, h = daemon.clients()
    reply, prompt = _left_unanswered(oai, h, "b")
    r = _turn(oai, "b", SECOND)
    ext = r.model_extra["engram"]
    assert r.choices[0].message.content == reply  # the same state, the same greedy reply
    assert ext["computed_tokens"] == 0 and ext["restored_tokens"] == prompt["tokens"] == ext["prompt_tokens"]
    messages = h.get("/v1/sessions/b").json()["messages"]
    assert [(m["role"], m["content"]) for m in messages[:3]] == [
        ("user", FIRST),
        ("assistant", messages[1]["content"]),
        ("user", SECOND),
    ]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]  # asked once, answered once


def test_another_message_keeps_the_unanswered_one_and_continues_from_the_state_before_it(daemon):
    oai, h = daemon.clients()
    _reply, prompt = _left_unanswered(oai, h, "b")
    before = h.post("/get_snapshot_info", json={"snapshot_id": prompt["parent"]}).json()
    r = _turn(oai, "b", "Something else.")
    ext = r.model_extra["engram"]
    assert ext["restored_tokens"] == before["tokens"] > 0  # from the state before the question, not from scratch
    messages = h.get("/v1/sessions/b").json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "user", "assistant"]
    # what the same state answers to both messages sent as one turn
    assert h.post("/restore_snapshot", json={"snapshot_id": prompt["parent"], "session": "c"}).status_code == 200
    both = oai.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": SECOND}, {"role": "user", "content": "Something else."}],
        temperature=0,
        max_tokens=6,
        extra_body={"session": "c"},
    )
    assert r.choices[0].message.content == both.choices[0].message.content
