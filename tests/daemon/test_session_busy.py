"""A session whose turn is still running cannot be deleted or reset (daemon/session_changes.py): the turn would
record into it when it ends, bringing a deleted session back or starting a reset one with the old question; a
restore that moves its head would be undone the same way. Through the real HTTP interface (an in-process daemon
on the tiny model) with the official openai client streaming the turn: a 409 that names the session while the
turn runs, and once it has ended (here: cancelled by the client going away) the change is made and stays made."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.helpers.inprocess import InProcessDaemon

LONG = 3000  # tokens asked for, with every end-of-sequence token banned: the turn runs until it is cancelled


@pytest.fixture
def daemon(tiny_engine, engram_home):
    engine = tiny_engine("transformers")
    with InProcessDaemon(engine) as d:
        d.eos = sorted(engine.tokenizer.eos_ids)
        yield d


def _turn(oai: openai.OpenAI, session: str, content: str, **kw):
    return oai.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": content}],
        temperature=0,
        extra_body={"session": session},
        **kw,
    )


def _long_stream(d, oai: openai.OpenAI, session: str):
    """A streamed turn on `session` that is still generating once its first piece has arrived."""
    stream = _turn(
        oai, session, "Go on and on.", max_tokens=LONG, stream=True, logit_bias={str(t): -100 for t in d.eos}
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            return stream
    raise AssertionError("the long turn ended before its first piece")


def _wait_recorded(h: httpx.Client, session: str, n_messages: int) -> list[dict]:
    deadline = time.monotonic() + 60
    while True:
        r = h.get(f"/v1/sessions/{session}")
        if r.status_code == 200 and len(r.json()["messages"]) >= n_messages:
            return r.json()["messages"]
        assert time.monotonic() < deadline, f"session {session}'s turn was never recorded: {r.text[:300]}"
        time.sleep(0.05)


def _busy(r: httpx.Response, session: str, change: str) -> None:
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "session_busy" and f"'{session}'" in error["message"] and change in error["message"]
    assert error["hint"]


def test_delete_and_reset_wait_for_the_running_turn_with_a_409_naming_the_session(daemon):
    oai, h = daemon.clients()
    with h:
        _turn(oai, "busy", "Hello.", max_tokens=3)  # a turn already recorded: the session has a head
        before = h.get("/v1/sessions/busy").json()
        stream = _long_stream(daemon, oai, "busy")
        _busy(h.delete("/v1/sessions/busy"), "busy", "deleted")
        _busy(h.post("/v1/sessions/busy/reset"), "busy", "reset")
        after = h.get("/v1/sessions/busy").json()  # refused: the conversation is as it was (its prompt committed)
        assert after["messages"][:2] == before["messages"] and after["n_snapshots"] > before["n_snapshots"]
        assert h.delete("/v1/sessions/other").status_code == 404  # another session is not held up by it
        stream.close()  # the client goes away: the turn ends at its next token, its partial reply recorded
        messages = _wait_recorded(h, "busy", 4)
        assert messages[-1]["finish_reason"] == "cancelled"
        r = h.delete("/v1/sessions/busy")
        assert r.status_code == 200 and len(r.json()["deleted_snapshots"]) >= 2, r.text
        time.sleep(0.5)  # nothing records into it afterwards: it stays deleted
        assert h.get("/v1/sessions/busy").status_code == 404
        assert not [s for s in h.get("/list_snapshots").json()["snapshots"] if s["session"] == "busy"]


def test_a_reset_after_the_turn_ended_starts_the_session_over_for_good(daemon):
    oai, h = daemon.clients()
    with h:
        stream = _long_stream(daemon, oai, "over")
        _busy(h.post("/v1/sessions/over/reset"), "over", "reset")
        stream.close()
        _wait_recorded(h, "over", 2)
        r = h.post("/v1/sessions/over/reset")
        assert r.status_code == 200 and r.json()["previous_head"] is not None, r.text
        time.sleep(0.5)
        session = h.get("/v1/sessions/over").json()
        assert session["messages"] == [] and session["head"] is None
        # the next turn starts from nothing: its transcript holds only itself
        _turn(oai, "over", "A fresh start.", max_tokens=3)
        assert [m["content"] for m in h.get("/v1/sessions/over").json()["messages"]][:1] == ["A fresh start."]


def test_an_engram_branch_delete_waits_for_the_branchs_running_turn(daemon):
    oai, h = daemon.clients()
    with h:
        _turn(oai, "trunk", "Hello.", max_tokens=3)
        saved = h.post("/save_snapshot", json={"conversation_id": "trunk", "branch_name": "alt"})
        assert saved.status_code == 200, saved.text
        branch = saved.json()["branch_session"]
        stream = _long_stream(daemon, oai, branch)
        r = h.post("/delete_snapshot", json={"conversation_id": "trunk", "branch_name": "alt"})
        _busy(r, branch, "deleted")
        assert r.json()["success"] is False  # the Engram server's failure shape rides along
        stream.close()
        _wait_recorded(h, branch, 4)
        r = h.post("/delete_snapshot", json={"conversation_id": "trunk", "branch_name": "alt"})
        assert r.status_code == 200 and r.json()["success"] is True, r.text
        time.sleep(0.5)
        assert h.get(f"/v1/sessions/{branch}").status_code == 404


def _engram_restore(h: httpx.Client, session: str, sid: str, done: bool) -> httpx.Response:
    r = h.post("/restore_snapshot", json={"snapshot_id": sid, "session_name": session})
    assert r.json()["success"] is done, r.text  # the Engram server's shape rides along, a refusal included
    return r


def _agent_restore(h: httpx.Client, session: str, sid: str, done: bool) -> httpx.Response:
    r = h.post("/v1/agent/call", json={"tool": "restore", "arguments": {"session": session, "checkpoint": sid}})
    assert not done or r.json()["result"]["snapshot_id"] == sid, r.text
    return r


@pytest.mark.parametrize("restore", [_engram_restore, _agent_restore], ids=["engram", "agent-tool"])
def test_a_restore_alone_waits_for_the_running_turn_with_a_409_naming_the_session(daemon, restore):
    oai, h = daemon.clients()
    with h:
        _turn(oai, "back", "Hello.", max_tokens=3)
        first = h.get("/v1/sessions/back").json()["head"]
        stream = _long_stream(daemon, oai, "back")
        # moving the head now would be undone when the running turn records: refused, naming the session
        _busy(restore(h, "back", first, False), "back", "restored")
        assert h.get("/v1/sessions/back").json()["head"] != first  # the running turn's prompt is the head
        stream.close()
        _wait_recorded(h, "back", 4)
        assert restore(h, "back", first, True).status_code == 200
        time.sleep(0.5)  # nothing records over it afterwards
        assert h.get("/v1/sessions/back").json()["head"] == first


def _checkpoint(h: httpx.Client) -> str:
    r = h.post("/v1/agent/call", json={"tool": "checkpoint", "arguments": {"session": "held", "label": "mid"}})
    assert r.status_code == 200, r.text
    return r.json()["result"]["snapshot_id"]


def _agent_branch(h: httpx.Client) -> str:
    r = h.post("/v1/agent/call", json={"tool": "branch", "arguments": {"source": "held", "new_session": "held-b"}})
    assert r.status_code == 200, r.text
    return r.json()["result"]["snapshot_id"]


def _engram_save(h: httpx.Client) -> str:
    r = h.post("/save_snapshot", json={"conversation_id": "held"})
    assert r.status_code == 200 and r.json()["success"], r.text
    return r.json()["snapshot_id"]


def _cli_branch(h: httpx.Client) -> str:  # what `engramctl snapshots branch held held-c` sends
    r = h.post("/branch_snapshot", json={"source": "held", "new_session": "held-c"})
    assert r.status_code == 200, r.text
    return h.get("/v1/sessions/held-c").json()["head"]


@pytest.mark.parametrize("take", [_checkpoint, _agent_branch, _engram_save, _cli_branch])
def test_a_checkpoint_or_branch_asked_for_mid_reply_takes_the_state_after_the_reply(daemon, take):
    oai, h = daemon.clients()
    with h, ThreadPoolExecutor(1) as pool:
        stream = _long_stream(daemon, oai, "held")
        taken = pool.submit(take, h)
        time.sleep(0.5)
        assert not taken.done()  # it waits for the reply being generated
        stream.close()  # the reply ends (cancelled by its client), recorded
        sid = taken.result(timeout=60)
        head = h.get("/v1/sessions/held").json()
        info = h.post("/get_snapshot_info", json={"snapshot_id": sid}).json()
        assert info["id"] == head["head"] and info["n_messages"] == 2  # the question and its reply, not it alone
        assert head["messages"][-1]["finish_reason"] == "cancelled"


def test_a_forced_delete_of_a_running_sessions_head_is_refused_naming_the_session(daemon):
    oai, h = daemon.clients()
    with h:
        _turn(oai, "kept", "Hello.", max_tokens=3)
        stream = _long_stream(daemon, oai, "kept")
        head = h.get("/v1/sessions/kept").json()["head"]
        r = h.post("/delete_snapshot", json={"snapshot_id": head, "force": True})
        _busy(r, "kept", "cannot be deleted until that turn ends")
        stream.close()
        messages = _wait_recorded(h, "kept", 4)  # the turn recorded its reply: its snapshot was not lost
        assert messages[-1]["finish_reason"] == "cancelled"
        after = h.get("/v1/sessions/kept").json()["head"]
        assert h.post("/get_snapshot_info", json={"snapshot_id": after}).json()["n_messages"] == 4
        assert h.post("/delete_snapshot", json={"snapshot_id": after, "force": True}).status_code == 200


def test_requests_abandoned_while_queued_give_up_their_place(tiny_engine, engram_home):
    engine = tiny_engine("transformers")
    with InProcessDaemon(engine, max_queue=2) as d:  # the transformers backend: one turn at a time
        d.eos = sorted(engine.tokenizer.eos_ids)
        oai, h = d.clients()
        with h:
            stream = _long_stream(d, oai, "first")  # holds the one seat
            body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
            for _ in range(2):  # two clients that give up while waiting for it
                with pytest.raises(httpx.TimeoutException):
                    httpx.post(d.url + "/v1/chat/completions", json=body, headers=h.headers, timeout=1.0)
            deadline = time.monotonic() + 10
            while h.get("/v1/status").json()["queue"]["waiting"]:
                assert time.monotonic() < deadline, "the abandoned requests still wait"
                time.sleep(0.05)
            with ThreadPoolExecutor(1) as pool:
                later = pool.submit(h.post, "/v1/chat/completions", json=body)  # not a 429: the line is empty
                time.sleep(0.3)
                stream.close()
                assert later.result(timeout=60).status_code == 200
