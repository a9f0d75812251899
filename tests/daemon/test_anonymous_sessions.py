"""Clients that resend their whole history (no `session`): the daemon files each conversation under an auto-
session. A turn continues that session only from its head with no other turn of it in flight; a fork (a
regenerate, another client whose conversation began alike) and turns sent at once each get their own, so
every snapshot's transcript is its own conversation, and one client's snapshots never age out under another's
turns. In-process daemon on the tiny GGUF (llama.cpp: several turns step together), the official openai client."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.helpers.inprocess import InProcessDaemon

SYSTEM = {"role": "system", "content": "You are terse."}


@pytest.fixture
def daemon(tiny_engine, engram_home):
    with InProcessDaemon(tiny_engine("llama.cpp")) as d:
        yield d


def _ask(oai: openai.OpenAI, messages: list[dict], seed: int | None = None) -> tuple[list[dict], dict]:
    """(the conversation with its reply, the engram extension); greedy, or sampled with `seed`."""
    sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
    r = oai.chat.completions.create(model="m", messages=messages, max_tokens=4, **sampling)
    reply = {"role": "assistant", "content": r.choices[0].message.content}
    return [*messages, reply], r.model_extra["engram"]


def _transcript(h: httpx.Client, sid: str) -> list[dict]:
    r = h.post("/get_snapshot_transcript", json={"snapshot_id": sid})
    assert r.status_code == 200, r.text
    return [{"role": m["role"], "content": m["content"]} for m in r.json()["messages"]]


def test_turns_sent_at_once_each_keep_their_own_transcript(daemon):
    oai, h = daemon.clients()
    first = [SYSTEM, {"role": "user", "content": "Name an animal."}]
    hist, _ = _ask(oai, first)
    requests = [
        hist + [{"role": "user", "content": "Why?"}],
        hist + [{"role": "user", "content": "Name a plant instead."}],
        first,  # a regenerate
        first,
    ]
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda m: _ask(oai, m), requests))
    for conversation, ext in answers:
        assert _transcript(h, ext["snapshot_id"]) == conversation
    sessions = [ext["session"] for _, ext in answers]
    assert len(set(sessions)) == len(sessions)  # at most one of them continues the first turn's session


def test_two_clients_whose_conversations_began_alike_do_not_share_a_session(daemon):
    oai, h = daemon.clients()
    a, ext_a = _ask(oai, [SYSTEM, {"role": "user", "content": "hi"}], seed=1)
    b, ext_b = _ask(oai, [SYSTEM, {"role": "user", "content": "hi"}], seed=2)  # another client, the same opening
    assert a[-1] != b[-1]  # two conversations from here (sampled alike, they would be one and the same)
    assert ext_b["session"] != ext_a["session"] and ext_b["cached_tokens"] > 0  # forked, from the shared state
    mine = h.get(f"/v1/sessions/{ext_a['session']}").json()
    for k in range(6):  # B talks on; in A's session, A's snapshots would age out under B's (keep_last 8)
        b, ext_b = _ask(oai, b + [{"role": "user", "content": f"more {k}"}])
        assert ext_b["session"] != ext_a["session"]
    after = h.get(f"/v1/sessions/{ext_a['session']}").json()
    assert (after["head"], after["n_snapshots"], after["messages"]) == (
        mine["head"],
        mine["n_snapshots"],
        mine["messages"],
    )
    a, ext_a2 = _ask(oai, a + [{"role": "user", "content": "and then?"}])
    assert ext_a2["session"] == ext_a["session"]  # A goes on in its own session (its transcript extended)
    assert ext_a2["cached_tokens"] >= ext_a["prompt_tokens"]  # from A's own state
