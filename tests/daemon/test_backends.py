"""What the daemon does above the engine must not depend on the backend: the paths where a llama.cpp
state differs in kind from a transformers one (one llama.cpp sequence shared by every conversation, the
others parked as blobs; a state released for good), on both backends, in-process (Starlette TestClient).

- a session answers as if never interrupted when its state was parked behind another conversation, kept
  hot, restored from RAM, or when a cancelled prefill (its own, or another's) took the model meanwhile;
- a stock OpenAI client's resent history reuses the longest stored prefix (`cached_tokens`) and answers
  as a full prefill does;
- the original Engram server's restore-and-generate (continuation_ids) answers as a stateless server does;
- a store written by one backend and served by the other: sessions go on from their transcripts, the
  other backend's snapshots are neither reused nor restored nor imported, each refusal naming the backends.

The broader route tests run on both backends too (tests/backends.py: test_live, test_restart, test_app,
tests/agent/test_rest, tests/cli/test_daemon_cli).
"""

from __future__ import annotations

import json
import threading

import pytest

from engramctl.daemon.job import Job
from engramctl.daemon.service import ChatRequest
from engramctl.engine.sampling_params import SamplingParams
from engramctl.errors import Cancelled
from tests.backends import BACKENDS, both_backends
from tests.daemon.conftest import greedy_reference
from tests.helpers import chat, served_app

GREEDY = {"temperature": 0, "max_tokens": 5}
QUESTIONS = ["Hello there", "Tell me more", "And then?", "Why is that?"]
LONG_PROMPT = "word " * 400  # ~1,200 tokens: several prefill chunks on either backend


@pytest.fixture
def client(backend, tiny_engine, engram_home):
    # One turn at a time, one state kept hot: these tests follow a state from hot to a tier and back
    # (tests/daemon/test_scheduler.py covers several conversations kept hot and batched).
    with served_app(tiny_engine(backend), serial_turns=True) as c:
        yield c


def _chat(client, messages, session=None, **extra) -> dict:
    return chat(client, session, messages, **{**GREEDY, **extra})


def _say(client, session: str, text: str) -> dict:
    return _chat(client, [{"role": "user", "content": text}], session)


def _reply(r: dict) -> str:
    return r["choices"][0]["message"]["content"]


def _total(r: dict) -> int:
    return r["usage"]["total_tokens"]


class CancelAfter(threading.Event):
    """A cancel event that turns set on its n-th look: a prefill stops after n-1 whole chunks."""

    def __init__(self, n: int):
        super().__init__()
        self.left = n

    def is_set(self) -> bool:
        self.left -= 1
        return self.left <= 0


def _cancelled_prefill(client, session: str, text: str, looks: int) -> None:
    """A turn cancelled during its prompt prefill, as the worker runs it when the client goes away."""
    req = ChatRequest([{"role": "user", "content": text}], session, SamplingParams(temperature=0.0, max_tokens=4))
    with pytest.raises(Cancelled):
        job = Job(lambda job: None, "cancelled prefill", None, turn=True, session=session)
        job.cancel = CancelAfter(looks)
        svc = client.daemon.service
        svc.run(svc.chat(req, job))


@both_backends
def test_a_session_answers_as_if_never_interrupted(client):
    ref = [_say(client, "ref", q) for q in QUESTIONS]  # one uninterrupted conversation, always hot
    assert [r["engram"]["tier"] for r in ref] == [None, "live", "live", "live"]
    svc = client.daemon.service

    first = _say(client, "s", QUESTIONS[0])
    assert _reply(first) == _reply(ref[0])
    # another conversation's prefill runs (and is cancelled half-way): on llama.cpp it parks s's state
    _cancelled_prefill(client, "other", LONG_PROMPT, looks=2)
    assert svc.hot.session == "s" and svc.hot.live.cache is not None  # still hot, never released
    second = _say(client, "s", QUESTIONS[1])
    assert second["engram"]["tier"] == "live" and second["engram"]["restored_tokens"] == _total(first)
    assert _reply(second) == _reply(ref[1])
    assert client.get("/v1/sessions/other").status_code == 404  # the cancelled turn recorded nothing

    # s's own next prefill is cancelled: its half-fed state is dropped, its head snapshot is intact
    _cancelled_prefill(client, "s", LONG_PROMPT, looks=2)
    assert svc.hot is None
    assert len(client.get("/v1/sessions/s").json()["messages"]) == 4
    third = _say(client, "s", QUESTIONS[2])
    assert third["engram"]["tier"] in ("ram", "vram") and third["engram"]["restored_tokens"] == _total(second)
    assert _reply(third) == _reply(ref[2])

    _say(client, "other", "Unrelated")  # replaces s as the hot state: s's next turn restores from RAM
    fourth = _say(client, "s", QUESTIONS[3])
    assert fourth["engram"]["tier"] in ("ram", "vram") and fourth["engram"]["restored_tokens"] == _total(third)
    assert _reply(fourth) == _reply(ref[3]) and _total(fourth) == _total(ref[3])
    user = [m["content"] for m in client.get("/v1/sessions/s").json()["messages"] if m["role"] == "user"]
    assert user == QUESTIONS


@both_backends
def test_a_resent_history_reuses_the_longest_stored_prefix(client, backend, tiny_engine):
    reference = tiny_engine(backend, "reference").backend
    messages = [{"role": "system", "content": "Be brief."}]
    previous = None
    for k, q in enumerate(QUESTIONS[:3]):
        messages.append({"role": "user", "content": q})
        r = _chat(client, messages)
        cached, ext = r["usage"]["prompt_tokens_details"]["cached_tokens"], r["engram"]
        assert cached == ext["restored_tokens"] and ext["computed_tokens"] == r["usage"]["prompt_tokens"] - cached
        if previous is None:
            assert cached == 0 and not ext["resumed"]
        else:  # at least the previous prompt's snapshot, at most its reply's
            assert previous["usage"]["prompt_tokens"] <= cached <= _total(previous), (cached, previous["usage"])
            assert ext["tier"] in ("ram", "vram")  # the session turn below took the model meanwhile
            assert ext["session"] == previous["engram"]["session"]  # the conversation it continues
        assert _reply(r) == greedy_reference(reference, messages, GREEDY["max_tokens"])
        messages.append({"role": "assistant", "content": _reply(r)})
        previous = r
        _say(client, f"between-{k}", "Something else")
    # streamed, the same history: the same answer and the same usage
    body = {
        "model": "default",
        "messages": messages[:-1],
        "stream": True,
        "stream_options": {"include_usage": True},
        **GREEDY,
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as s:
        chunks = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == _reply(previous)
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens"] == previous["usage"]["prompt_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"]  # its prompt snapshot


@both_backends
def test_engram_restore_and_generate_answers_as_a_stateless_server(client, backend, tiny_engine):
    """The original Engram server's restore-and-generate (continuation_ids, through /restore_snapshot) from a
    state that is not hot: the same tokens as a stateless full prefill on the same backend, every time."""
    from tests.daemon.test_engram_api import generate_from, user_turn_ids

    reference = tiny_engine(backend, "reference").backend
    first = _say(client, "gen", "My favorite color is blue.")
    saved = client.post("/save_snapshot", json={"conversation_id": "gen", "turn_number": 1}).json()
    assert saved["success"] and saved["snapshot_id"] == "gen-t1", saved  # the Engram server's own name for it
    fill = client.post("/get_snapshot_info", json={"snapshot_id": "gen-t1"}).json()["metadata"]["fill_ids"]
    assert len(fill) == _total(first)
    ids = user_turn_ids(reference.tokenizer, "What is my favorite color?")
    expected = generate_from(reference, fill + ids, temperature=0, max_tokens=6)
    body = {"conversation_id": "gen", "turn_number": 1, "continuation_ids": ids, "max_new_tokens": 6}
    for before in ("other", "gen"):  # another conversation, then gen's own turn 2, took the model meanwhile
        _say(client, before, "Something else")
        r = client.post("/restore_snapshot", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert (out["output_ids"], out["output_text"]) == expected
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == len(fill) and out["token_count"] == len(fill)
        assert out["engram"]["tier"] in ("ram", "vram")


@pytest.mark.parametrize("writer", BACKENDS)
def test_a_store_written_by_the_other_backend_goes_on_from_transcripts(writer, tiny_engine, engram_home, tmp_path):
    """The daemon restarted on the other backend over the same data: nothing is lost, nothing foreign is
    restored (its state is not interchangeable), and every refusal names the two backends."""
    reader = next(b for b in BACKENDS if b != writer)
    with served_app(tiny_engine(writer)) as c:
        first = _say(c, "s", QUESTIONS[0])
        second = _say(c, "s", QUESTIONS[1])
        anon = [{"role": "user", "content": "Hello there"}]
        anon_first = _chat(c, anon)
        export = c.post("/get_snapshot_transcript", json={"snapshot_id": second["engram"]["snapshot_id"]}).json()
        from engramctl.store import exchange

        packed = exchange.pack(c.daemon.store.snapshots.load(second["engram"]["snapshot_id"]), export["messages"], "s")

    with served_app(tiny_engine(reader)) as c:
        # a restore of the other backend's snapshot is refused, naming both, and changes nothing
        r = c.post("/restore_snapshot", json={"snapshot_id": second["engram"]["snapshot_id"]})
        assert r.status_code == 409, r.text
        msg = r.json()["error"]["message"]
        assert f"written by the {writer} backend" in msg and f"runs on {reader}" in msg, msg
        assert r.json()["error"]["hint"].endswith(f"--backend {writer}")
        # so is an import of its export, before anything is stored
        r = c.post(
            "/import_snapshot?session=copy", content=packed, headers={"Content-Type": "application/octet-stream"}
        )
        assert r.status_code == 409 and r.json()["error"]["code"] == "snapshot_mismatch", r.text
        msg = r.json()["error"]["message"]
        assert f"on the {writer} backend" in msg and f"'tiny-gmh' on {reader}" in msg, msg
        assert r.json()["error"]["hint"].endswith(f"--model tiny-gmh --backend {writer}")
        assert c.get("/v1/sessions/copy").status_code == 404

        # the session goes on from its transcript (re-prefilled), which holds the writer's replies
        third = _say(c, "s", QUESTIONS[2])
        assert not third["engram"]["resumed"] and third["engram"]["restored_tokens"] == 0
        assert third["engram"]["computed_tokens"] == third["usage"]["prompt_tokens"] > _total(second)
        msgs = c.get("/v1/sessions/s").json()["messages"]
        assert [m["content"] for m in msgs if m["role"] == "user"] == QUESTIONS[:3]
        assert msgs[1]["content"] == _reply(first) and msgs[3]["content"] == _reply(second)
        again = _say(c, "s", QUESTIONS[3])  # and from here on from this backend's own state
        assert again["engram"]["tier"] == "live" and again["engram"]["restored_tokens"] == _total(third)
        # a stock client's history matches no foreign snapshot: computed in full, as a full prefill answers
        r = _chat(c, anon)
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and not r["engram"]["resumed"]
        assert r["usage"]["prompt_tokens"] == anon_first["usage"]["prompt_tokens"]  # one tokenizer, two backends
        assert _reply(r) == greedy_reference(tiny_engine(reader, "reference").backend, anon, GREEDY["max_tokens"])
