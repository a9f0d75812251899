"""The agent WebSocket against a real daemon process, with a real WebSocket client (`websockets`):
a conversation that checkpoints, branches and restores and then continues exactly from the restored
point; malformed messages get an error event and the connection and its state survive; cancel; auth."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from engramctl.store.names import session_for_conversation
from tests.agent.conftest import greedy_reference
from tests.backends import both_backends
from tests.helpers import module_daemon

N = 6  # tokens per greedy reply
GREEDY = {"temperature": 0, "max_tokens": N}

pytestmark = both_backends


daemon = module_daemon("agent-ws-home")


class Conn:
    """A test-side WebSocket conversation: send a message, read events until its answer."""

    def __init__(self, daemon, session: str | None = None, headers: bool = True):
        url = daemon.url.replace("http://", "ws://") + "/v1/agent/ws" + (f"?session={session}" if session else "")
        self.ws = connect(
            url, additional_headers=daemon.headers if headers else None, proxy=None, open_timeout=10
        ).__enter__()
        self.n = 0
        self.ready = self.recv() if headers else None

    def recv(self, timeout: float = 60) -> dict:
        return json.loads(self.ws.recv(timeout))

    def send(self, **msg) -> int:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, **msg}))
        return self.n

    def until(self, mid, *types: str) -> tuple[dict, list[dict]]:
        """Events up to the first of `types` answering `mid` (returned), and the ones before it."""
        before = []
        while True:
            ev = self.recv()
            if ev.get("id") == mid and ev["type"] in types:
                return ev, before
            before.append(ev)

    def chat(self, content: str, **sampling) -> dict:
        mid = self.send(type="chat", content=content, **{**GREEDY, **sampling})
        done, tokens = self.until(mid, "done", "error")
        assert done["type"] == "done", done
        assert "".join(t["text"] for t in tokens if t["type"] == "token") == done["text"]
        return done

    def call(self, tool: str, **arguments) -> dict:
        mid = self.send(type="call", tool=tool, arguments=arguments)
        ev, _ = self.until(mid, "result", "error")
        assert ev["type"] == "result", ev
        assert ev["tool"] == tool
        return ev["result"]

    def close(self) -> None:
        self.ws.close()


def test_checkpoint_branch_restore_continue_exactly(daemon, reference_backend):
    c = Conn(daemon, "agent")
    assert c.ready == {
        "type": "ready",
        "session": "agent",
        "model": c.ready["model"],
        "protocol": 1,
        "tools": ["checkpoint", "branch", "restore", "list_checkpoints", "delete_checkpoint", "session_info"],
    }
    first = c.chat("Hello there")
    assert first["finish_reason"] == "length" and first["usage"]["completion_tokens"] == N
    # what a stateless server computes from the same message
    assert greedy_reference(reference_backend, [{"role": "user", "content": "Hello there"}], N) == first["text"]
    assert first["engram"]["session"] == "agent"
    cp = c.call("checkpoint", label="before the choice")  # session: this connection's
    assert cp["session"] == "agent" and cp["snapshot_id"] == first["engram"]["snapshot_id"]

    option_a = c.chat("Try option A")
    branched = c.call("branch", new_session="agent-b", checkpoint="before the choice")  # source: this connection's
    assert branched["snapshot_id"] == cp["snapshot_id"]
    c.chat("Try option B instead", max_tokens=3)  # move further on, then come back
    restored = c.call("restore", checkpoint="before the choice")
    assert restored["snapshot_id"] == cp["snapshot_id"] and restored["n_messages"] == 2
    info = c.call("session_info")
    assert info["head"] == cp["snapshot_id"] and info["hot"] and info["tokens"] == cp["tokens"]

    again = c.chat("Try option A")
    assert again["text"] == option_a["text"]  # the next greedy reply is the one from the restored point
    assert again["engram"]["restored_tokens"] == cp["tokens"] and again["engram"]["tier"] == "live"

    b = Conn(daemon, "agent-b")  # the branch, on its own connection
    assert b.chat("Try option A")["text"] == option_a["text"]
    with daemon.http() as h:
        msgs = h.get("/v1/sessions/agent").json()["messages"]
        assert [m["content"] for m in msgs[::2]] == ["Hello there", "Try option A"]  # rewound, then continued
        assert len(h.get("/v1/sessions/agent-b").json()["messages"]) == 4
    listed = c.call("list_checkpoints")
    assert [x["label"] for x in listed["checkpoints"]] == ["before the choice"]
    b.close()
    c.close()


def test_json_the_server_cannot_read_is_an_error_event_too(daemon):
    """Valid JSON that Python's parser refuses (a 5,000-digit integer, nesting deeper than its recursion
    limit) is answered like any malformed frame; the connection and its session go on."""
    c = Conn(daemon, "odd-json")
    for raw in ('{"type": "ping", "id": ' + "9" * 5000 + "}", "[" * 100_000 + "]" * 100_000):
        c.ws.send(raw)
        ev = c.recv()
        assert ev["type"] == "error" and ev["error"]["code"] == "invalid_json" and ev["error"]["message"], ev
    mid = c.send(type="ping")
    assert c.recv() == {"type": "pong", "id": mid}
    c.close()


def test_malformed_messages_get_an_error_and_keep_the_connection(daemon):
    c = Conn(daemon, "sturdy")
    c.chat("Hello there")
    with daemon.http() as h:
        before = h.get("/v1/sessions/sturdy").json()
    cases = [  # (raw frame, error code, param)
        ("{not json", "invalid_json", None),
        (b"\xff\xfe", "invalid_message", None),
        ("[1, 2]", "invalid_message", None),
        ('{"id": 1}', "invalid_message", "type"),
        ('{"type": "sing"}', "invalid_message", "type"),
        ('{"type": "ping", "id": {"x": 1}}', "invalid_message", "id"),
        ('{"type": "chat", "id": 2}', "invalid_message", "content"),
        ('{"type": "chat", "content": ""}', "invalid_message", "content"),
        ('{"type": "chat", "content": "x", "temperature": "hot"}', "invalid_message", "temperature"),
        ('{"type": "chat", "content": "x", "bogus": 1}', "invalid_message", "bogus"),
        ('{"type": "chat", "messages": [{"role": "wizard", "content": "x"}]}', "invalid_message", "messages[0].role"),
        ('{"type": "call"}', "invalid_message", "tool"),
        ('{"type": "call", "tool": "rm_rf"}', "unknown_tool", "tool"),
        ('{"type": "call", "tool": "checkpoint", "arguments": {"label": 5}}', "invalid_arguments", "label"),
        ('{"type": "call", "tool": "checkpoint", "arguments": "[1]"}', "invalid_arguments", "arguments"),
        ('{"type": "call", "tool": "restore", "arguments": {"checkpoint": "nope"}}', "not_found", None),
        (
            '{"type": "call", "tool": "branch", "arguments": {"new_session": "../x"}}',
            "invalid_arguments",
            "new_session",
        ),
        ('{"type": "auth", "token": "x"}', "invalid_message", "type"),
    ]
    for raw, code, param in cases:
        c.ws.send(raw)
        ev = c.recv()
        assert ev["type"] == "error" and ev["error"]["code"] == code, (raw, ev)
        assert ev["error"].get("param") == param, (raw, ev)
        assert ev["error"]["message"]
    mid = c.send(type="ping")
    assert c.recv() == {"type": "pong", "id": mid}
    with daemon.http() as h:
        assert h.get("/v1/sessions/sturdy").json() == before  # nothing changed
    assert c.chat("Still there?")["engram"]["restored_tokens"] > 0  # same conversation, state intact

    # one reply at a time; cancel stops it (the partial reply is recorded) and the conversation goes on
    long = c.send(type="chat", content="Tell me a long story", temperature=0, max_tokens=3000)
    first_token, _ = c.until(long, "token")
    busy = c.send(type="chat", content="me too")
    ev, _ = c.until(busy, "error")
    assert ev["error"]["code"] == "busy"
    cancel = c.send(type="cancel")
    ack, _ = c.until(cancel, "cancelled")
    assert ack["reply_id"] == long
    done, _ = c.until(long, "done")
    assert done["finish_reason"] == "cancelled" and 0 < done["usage"]["completion_tokens"] < 3000
    nothing = c.send(type="cancel")
    assert c.until(nothing, "cancelled")[0]["reply_id"] is None
    assert c.chat("And now?")["finish_reason"] == "length"
    with daemon.http() as h:
        assert len(h.get("/v1/sessions/sturdy").json()["messages"]) == before["n_messages"] + 6
    c.close()


def test_auth_by_header_or_first_message(daemon):
    url = daemon.url.replace("http://", "ws://") + "/v1/agent/ws"
    with pytest.raises(InvalidStatus) as e:
        connect(url, additional_headers={"Authorization": "Bearer wrong"}, proxy=None)
    assert e.value.response.status_code == 401
    assert json.loads(e.value.response.body)["error"]["code"] == "authentication_error"
    with pytest.raises(InvalidStatus) as e:
        connect(url + "?session=../x", additional_headers=daemon.headers, proxy=None)
    assert e.value.response.status_code == 400
    assert json.loads(e.value.response.body)["error"]["code"] == "invalid_name"
    with pytest.raises(InvalidStatus) as e:  # the original Engram server's name for a session, but not two names
        connect(url + "?session=a&conversation_id=b", additional_headers=daemon.headers, proxy=None)
    assert e.value.response.status_code == 400 and "give one" in e.value.response.body.decode()
    long_id = "c" * 200  # an Engram conversation_id may be longer than a session name: the store's own mapping
    with connect(url + f"?conversation_id={long_id}", additional_headers=daemon.headers, proxy=None) as ws:
        ready = json.loads(ws.recv(10))
        assert ready["type"] == "ready" and ready["session"] == session_for_conversation(long_id) != long_id
    for first in ({"type": "auth", "token": "wrong"}, {"type": "chat", "content": "hi"}):
        with connect(url, proxy=None) as ws:
            ws.send(json.dumps(first))
            assert json.loads(ws.recv(10))["error"]["code"] == "authentication_error"
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(10)
            assert closed.value.rcvd.code == 1008
    with connect(url, proxy=None) as ws:
        ws.send(json.dumps({"type": "auth", "token": daemon.token, "session": "by-message"}))
        ready = json.loads(ws.recv(10))
        assert ready["type"] == "ready" and ready["session"] == "by-message"
        ws.send(json.dumps({"type": "call", "id": "a", "tool": "session_info"}))
        assert json.loads(ws.recv(10))["error"]["code"] == "not_found"  # nothing said yet in that session
    # the REST routes of the same daemon refuse a missing token too
    assert httpx.get(daemon.url + "/v1/agent/tools").status_code == 401
    assert httpx.post(daemon.url + "/v1/agent/call", json={"tool": "session_info"}).status_code == 401


def test_docs_worked_example_runs(daemon):
    """docs/agents.md's worked example, as printed, against this daemon."""
    import os
    import re
    import subprocess
    import sys

    from tests.daemon.conftest import ROOT

    doc = (ROOT / "docs" / "agents.md").read_text()
    section = doc[doc.index("## Worked example") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    env = {**os.environ, "ENGRAM_URL": daemon.url, "ENGRAM_API_KEY": daemon.token}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "sort-logs continues from" in proc.stdout and "tokens of state" in proc.stdout
    with daemon.http() as h:
        names = {s["name"] for s in h.get("/v1/sessions").json()["sessions"]}
        assert "sort-logs" in names and len({"sort-logs-merge", "sort-logs-sqlite"} & names) == 1
        msgs = h.get("/v1/sessions/sort-logs").json()["messages"]
        assert len(msgs) == 6 and msgs[-2]["content"] == "Good. What could go wrong?"
