"""The agent REST routes and the model's own tool calls, in-process (Starlette TestClient) with a tiny
real model: the token, every tool end to end, bad arguments change nothing, the OpenAI tool-call flow."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from engramctl.agent.tools import STATE_TOOLS, openai_tools, result_schemas
from tests.agent.conftest import TOKEN
from tests.agent.test_tools import BAD
from tests.backends import both_backends
from tests import helpers
from tests.helpers import served_app

GREEDY = {"temperature": 0, "max_tokens": 3}


@pytest.fixture
def client(engine, engram_home):
    with served_app(engine, TOKEN, max_queue=4) as c:
        yield c


@pytest.fixture
def app(client):
    return client.app


def call(client, tool: str, **arguments):
    return client.post("/v1/agent/call", json={"tool": tool, "arguments": arguments})


def ok(client, tool: str, **arguments) -> dict:
    r = call(client, tool, **arguments)
    assert r.status_code == 200, (tool, arguments, r.text)
    body = r.json()
    assert body["tool"] == tool
    from engramctl.agent.schema_check import check
    from engramctl.agent.tools import TOOLS

    check(TOOLS[tool].returns, body["result"], "")  # every result matches its published schema
    return body["result"]


chat = functools.partial(helpers.chat, max_tokens=GREEDY["max_tokens"])


def stored(client) -> dict:
    """Everything stored (snapshots with pins/labels, sessions with heads, transcripts)."""
    snaps = client.post("/list_snapshots", json={}).json()["snapshots"]
    sessions = client.get("/v1/sessions").json()["sessions"]
    keep = ("snapshot_id", "session", "parent", "tokens", "pinned", "label")
    return {
        "snaps": [{k: s[k] for k in keep} for s in snaps],
        "sessions": [(s["name"], s["head"], s["n_messages"]) for s in sessions],
        "transcripts": {s["name"]: client.get(f"/v1/sessions/{s['name']}").json()["messages"] for s in sessions},
    }


def test_agent_routes_need_the_token(client):
    for auth in ("", "Bearer wrong", f"Basic {TOKEN}"):
        h = {"Authorization": auth}
        assert client.get("/v1/agent/tools", headers=h).status_code == 401
        r = client.post("/v1/agent/call", headers=h, json={"tool": "session_info", "arguments": {"session": "s"}})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(WebSocketDenialResponse) as e:
        with client.websocket_connect("/v1/agent/ws", headers={"Authorization": "Bearer wrong"}):
            pass
    assert e.value.status_code == 401 and e.value.json()["error"]["code"] == "authentication_error"
    anonymous = TestClient(client.app)
    for first in ({"type": "auth", "token": "wrong"}, {"type": "chat", "content": "hi"}, {"type": "auth"}):
        with anonymous.websocket_connect("/v1/agent/ws") as ws:
            ws.send_json(first)
            msg = ws.receive_json()
            assert msg["type"] == "error" and msg["error"]["code"] == "authentication_error", msg
            assert ws.receive()["type"] == "websocket.close"
    with anonymous.websocket_connect("/v1/agent/ws?session=first-msg") as ws:
        ws.send_json({"type": "auth", "token": TOKEN})
        ready = ws.receive_json()
        assert ready["type"] == "ready" and ready["session"] == "first-msg" and ready["tools"] == list(STATE_TOOLS)


def test_tools_endpoint_serves_the_one_definition(client):
    body = client.get("/v1/agent/tools").json()
    assert body["tools"] == openai_tools() and body["results"] == result_schemas()
    assert [t["function"]["name"] for t in body["tools"]] == list(STATE_TOOLS)
    with_chat = client.get("/v1/agent/tools?include_chat=true").json()
    assert with_chat["tools"][-1]["function"]["name"] == "chat" and "chat" in with_chat["results"]


@both_backends
def test_every_tool_end_to_end(client, app):
    d = app.state.daemon
    first = chat(client, "s", "Hello there")
    h1 = first["engram"]["snapshot_id"]
    cp = ok(client, "checkpoint", session="s", label="before")
    assert cp["snapshot_id"] == h1 and cp["label"] == "before" and cp["pinned"] and cp["n_messages"] == 2
    second = chat(client, "s", "Tell me more")
    h2 = second["engram"]["snapshot_id"]

    info = ok(client, "session_info", session="s")
    assert info["head"] == h2 and info["hot"] and info["tier"] in ("vram", "ram", "disk")
    assert info["tokens"] == d.store.snapshots.info(h2).n_tokens > cp["tokens"] and info["snapshot_bytes"] > 0
    assert info["n_messages"] == 4 and info["n_checkpoints"] == 1 and info["stored_bytes"] >= info["snapshot_bytes"]

    listed = ok(client, "list_checkpoints", session="s")
    assert listed["head"] == h2 and [c["snapshot_id"] for c in listed["checkpoints"]] == [h1]
    assert listed["checkpoints"][0]["in_history"] and not listed["checkpoints"][0]["is_head"]
    turns = ok(client, "list_checkpoints", session="s", include_turns=True)["checkpoints"]
    assert h2 in [c["snapshot_id"] for c in turns] and len(turns) >= 3

    # branch from a session head, a checkpoint of a session, a label alone, a snapshot id (prefix)
    assert ok(client, "branch", source="s", new_session="b-head")["snapshot_id"] == h2
    b = ok(client, "branch", source="s", checkpoint="before", new_session="b-cp")
    assert b["snapshot_id"] == h1 and b["source_session"] == "s" and b["n_messages"] == 2
    assert ok(client, "branch", source="before", new_session="b-label")["snapshot_id"] == h1
    assert ok(client, "branch", source=h1[:12], new_session="b-prefix")["snapshot_id"] == h1
    assert client.get("/v1/sessions/b-cp").json()["messages"] == client.get("/v1/sessions/s").json()["messages"][:2]

    # restore: head and transcript go back; later snapshots stay listed; the state is loaded hot
    r = ok(client, "restore", session="s", checkpoint="before")
    assert r["snapshot_id"] == h1 and r["previous_head"] == h2 and r["n_messages"] == 2 and r["tokens"] == cp["tokens"]
    assert d.service.hot.session == "s" and d.service.hot.head == h1
    assert len(client.get("/v1/sessions/s").json()["messages"]) == 2
    listed = ok(client, "list_checkpoints", session="s", include_turns=True)["checkpoints"]
    assert h2 in [c["snapshot_id"] for c in listed]
    again = chat(client, "s", "Tell me more")  # the same turn from the same point: the same greedy reply
    assert again["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]
    assert again["engram"]["restored_tokens"] == cp["tokens"]
    assert ok(client, "restore", session="s", checkpoint=h2)["snapshot_id"] == h2  # forward again, by id

    # a branch may restore to its source's history; a session may adopt a branch grown from it; an
    # unrelated conversation's snapshot is refused
    assert ok(client, "restore", session="b-head", checkpoint=h1)["snapshot_id"] == h1
    explored = chat(client, "b-cp", "Try something else")
    end = ok(client, "checkpoint", session="b-cp", label="explored")
    assert end["snapshot_id"] == explored["engram"]["snapshot_id"]
    adopted = ok(client, "restore", session="s", checkpoint="explored")  # by label, found in the branch
    assert adopted["snapshot_id"] == end["snapshot_id"] and adopted["previous_head"] == h2
    assert client.get("/v1/sessions/s").json()["messages"] == client.get("/v1/sessions/b-cp").json()["messages"]
    assert ok(client, "restore", session="s", checkpoint=h2)["snapshot_id"] == h2
    chat(client, "other", "Unrelated")
    foreign = d.store.sessions.get("other").head
    for ref in (foreign, foreign[:31]):
        r = call(client, "restore", session="b-cp", checkpoint=ref)
        assert r.status_code == 400 and r.json()["error"]["param"] == "checkpoint", r.text
        assert "'other'" in r.json()["error"]["message"] and "branch" in r.json()["error"]["hint"]

    # delete: a branch point keeps its data, a free checkpoint goes
    kept = ok(client, "delete_checkpoint", id=h1)
    assert kept == {"snapshot_id": h1, "session": "s", "deleted": False, "reason": kept["reason"]} and kept["reason"]
    assert not d.store.snapshots.info(h1).pinned and d.store.snapshots.info(h1).label is None
    assert ok(client, "list_checkpoints", session="s")["checkpoints"] == []
    chat(client, "solo", "Hello there")
    free = ok(client, "checkpoint", session="solo", label="second")["snapshot_id"]
    chat(client, "solo", "And then?")
    gone = ok(client, "delete_checkpoint", id=free[:31])
    assert gone["deleted"] and gone["snapshot_id"] == free
    assert free not in [s["snapshot_id"] for s in client.post("/list_snapshots", json={}).json()["snapshots"]]

    # the chat tool (REST and MCP use it)
    c = ok(client, "chat", session="s", message="Hi again", **GREEDY)
    assert c["session"] == "s" and c["finish_reason"] == "length" and c["usage"]["completion_tokens"] == 3
    assert c["resumed"] and c["tier"] in ("live", "ram") and c["snapshot_id"] == d.store.sessions.get("s").head


def test_bad_arguments_change_nothing(client):
    chat(client, "s", "Hello there")
    ok(client, "checkpoint", session="s", label="before step 3")
    ok(client, "branch", source="s", new_session="s-alt")
    before = stored(client)
    for tool, cases in BAD.items():
        for args, field in cases:
            r = call(client, tool, **args)
            assert r.status_code == 400, (tool, args, r.text)
            err = r.json()["error"]
            assert err["param"] == field and err["message"].startswith(f"{field}: ")
            assert err["code"] == "invalid_arguments"
    semantic = [  # valid shapes, impossible requests
        ("checkpoint", {"session": "nobody"}, 404),
        ("restore", {"session": "s", "checkpoint": "no-such-label"}, 404),
        ("restore", {"session": "nobody", "checkpoint": "x"}, 404),
        ("restore", {"session": "s", "checkpoint": "0" * 32}, 404),
        ("branch", {"source": "s", "new_session": "s-alt"}, 409),
        ("branch", {"source": "nobody", "new_session": "z"}, 404),
        ("branch", {"source": "s", "checkpoint": "nope", "new_session": "z"}, 404),
        ("delete_checkpoint", {"id": "0" * 32}, 404),
        ("list_checkpoints", {"session": "nobody"}, 404),
        ("session_info", {"session": "nobody"}, 404),
    ]
    for tool, args, status in semantic:
        r = call(client, tool, **args)
        assert r.status_code == status, (tool, args, r.text)
        assert r.json()["error"]["message"]
    for body, param in (
        ({"tool": "rm", "arguments": {}}, "tool"),
        ({"tool": "session_info", "arguments": "{x"}, "arguments"),
    ):
        r = client.post("/v1/agent/call", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    for raw in (
        b"{not json",
        b"[]",
        b'{"arguments": {}}',
        b'{"tool": "session_info", "arguments": [1]}',
        b'{"tool": "session_info", "extra": 1}',
    ):
        r = client.post("/v1/agent/call", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (raw, r.text)
    assert stored(client) == before


# -- the model's own tool calls -------------------------------------------------------------------------------
def _script(monkeypatch, app, reply: str) -> list:
    """The model 'writes' `reply` (the turn runs for real; only its text is replaced, in its result and in its
    stream: the first piece says all of it, the others nothing). Returns the turns seen."""
    svc = app.state.daemon.service
    real, seen = getattr(svc, "unscripted_chat", svc.chat), []  # a second script replaces the first
    monkeypatch.setattr(svc, "unscripted_chat", real, raising=False)

    def scripted(req, job=None):
        seen.append(req)
        seq = real(req, job)  # the planned turn: its result, once it has run, with the scripted text
        seq.answer = lambda r: dataclasses.replace(r, text=reply)
        emit, pieces = seq.emit, []

        def emit_scripted(kind, value):
            if kind == "piece":
                pieces.append(value)
                if len(pieces) > 1:
                    return
                value = reply
            emit(kind, value)

        seq.emit = emit_scripted
        return seq

    monkeypatch.setattr(svc, "chat", scripted)
    return seen


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


@both_backends
def test_model_tool_calls_run_in_its_session(client, app, monkeypatch):
    chat(client, "agent", "Hello there")
    seen = _script(
        monkeypatch,
        app,
        'Saving.\n<tool_call>\n{"name": "checkpoint", "arguments": {"label": "mine"}}'
        '\n</tool_call>\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}'
        "</tool_call>",
    )
    body = {
        "model": "default",
        "session": "agent",
        "messages": [{"role": "user", "content": "save"}],
        "tools": openai_tools() + [WEATHER],
        **GREEDY,
    }
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Saving."
    cp_call, weather_call = choice["message"]["tool_calls"]
    assert cp_call["function"]["name"] == "checkpoint"
    assert json.loads(cp_call["function"]["arguments"]) == {"label": "mine"}
    assert weather_call["function"]["name"] == "get_weather"  # the client's own: returned, not run
    (result,) = out["engram"]["tool_results"]
    assert result["tool_call_id"] == cp_call["id"] and result["ok"]
    sid = result["result"]["snapshot_id"]
    assert sid == out["engram"]["snapshot_id"]  # the state right after the reply that asked for it
    rec = app.state.daemon.store.snapshots.info(sid)
    assert rec.pinned and rec.label == "mine" and rec.session == "agent"
    (msg,) = out["engram"]["tool_messages"]
    assert msg["role"] == "tool" and msg["tool_call_id"] == cp_call["id"]
    assert json.loads(msg["content"]) == result["result"]
    # the model was told about the tools, once per conversation
    prompt = seen[0].messages[0]
    assert prompt["role"] == "system" and "<tools>" in prompt["content"] and "get_weather" in prompt["content"]
    # the flow goes on: the client sends the tool results back in the session
    monkeypatch.undo()
    r = client.post(
        "/v1/chat/completions",
        json={**body, "messages": [msg, {"role": "tool", "tool_call_id": weather_call["id"], "content": "sunny"}]},
    )
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length"), r.text
    transcript = client.get("/v1/sessions/agent").json()["messages"]
    assert [m["role"] for m in transcript] == [
        "user",
        "assistant",
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]


def test_model_tool_call_errors_streaming_and_tool_choice(client, app, monkeypatch):
    _script(monkeypatch, app, '{"name": "restore", "arguments": {"checkpoint": "never-made"}}')
    body = {"model": "default", "messages": [{"role": "user", "content": "go back"}], "tools": openai_tools(), **GREEDY}
    out = client.post("/v1/chat/completions", json=body).json()
    (res,) = out["engram"]["tool_results"]
    assert not res["ok"] and res["error"]["code"] == "not_found" and out["engram"]["session"].startswith("auto-")
    assert "error" in json.loads(out["engram"]["tool_messages"][0]["content"])
    # bad arguments from the model: an error result naming the field, nothing run
    _script(monkeypatch, app, '<tool_call>{"name": "checkpoint", "arguments": {"label": 7}}</tool_call>')
    out = client.post("/v1/chat/completions", json=body).json()
    assert out["engram"]["tool_results"][0]["error"]["param"] == "label"
    # streamed: the same answer as SSE chunks
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=streamed) as r:
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:") and "[DONE]" not in line]
    deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
    assert deltas[0]["role"] == "assistant" and deltas[1]["tool_calls"][0]["function"]["name"] == "checkpoint"
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls" and "engram" not in events[-2]
    assert events[-1]["choices"] == [] and events[-1]["engram"]["tool_results"]  # the trailing chunk (issue 18)
    assert events[-1]["usage"]["completion_tokens"] == 3
    # a call written without the tag (bare JSON: parsed as a call) streams as a call, not as text first
    _script(monkeypatch, app, '{"name": "checkpoint", "arguments": {"label": 7}}')
    with client.stream("POST", "/v1/chat/completions", json=streamed) as r:
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:") and "[DONE]" not in line]
    deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
    assert not any(d.get("content") for d in deltas) and deltas[1]["tool_calls"][0]["function"]["name"] == "checkpoint"
    # tool_choice none: the tools stay in the prompt (the conversation's prefix), no parsing, nothing run
    seen = _script(monkeypatch, app, '{"name": "checkpoint", "arguments": {}}')
    out = client.post("/v1/chat/completions", json={**body, "tool_choice": "none"}).json()
    assert out["choices"][0]["message"]["content"] == '{"name": "checkpoint", "arguments": {}}'
    assert "tool_results" not in out["engram"] and "<tools>" in seen[0].messages[0]["content"]
    # a plain reply with tools declared is a plain answer
    _script(monkeypatch, app, "No tools needed.")
    out = client.post("/v1/chat/completions", json=body).json()
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "No tools needed."}
    assert out["choices"][0]["finish_reason"] in ("stop", "length")
    # a tool_choice that is none of OpenAI's, or names an undeclared function: a 400 naming it
    for choice, param in (
        ("banana", "tool_choice"),
        (42, "tool_choice"),
        ({"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name"),
    ):
        r = client.post("/v1/chat/completions", json={**body, "tool_choice": choice})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param and param in err["message"], (choice, r.text)
    r = client.post(
        "/v1/chat/completions", json={**{k: v for k, v in body.items() if k != "tools"}, "tool_choice": "required"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
    assert client.post("/v1/chat/completions", json={**body, "tool_choice": "auto"}).status_code == 200
    # malformed tools are a 400
    r = client.post("/v1/chat/completions", json={**body, "tools": [{"type": "retrieval"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0]", r.text


def test_openai_client_reads_the_tool_call_flow(client, app, monkeypatch):
    import openai

    _script(monkeypatch, app, '<tool_call>{"name": "checkpoint", "arguments": {"label": "oai"}}</tool_call>')
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key=TOKEN, http_client=client, max_retries=0)
    tools = client.get("/v1/agent/tools").json()["tools"]
    r = oai.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Save your progress."}],
        tools=tools,
        extra_body={"session": "self-saving"},
        **GREEDY,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (tc,) = choice.message.tool_calls
    assert tc.function.name == "checkpoint" and json.loads(tc.function.arguments) == {"label": "oai"}
    (msg,) = r.model_extra["engram"]["tool_messages"]
    assert msg["tool_call_id"] == tc.id and json.loads(msg["content"])["label"] == "oai"
    monkeypatch.undo()
    # the assistant message as the SDK hands it back, plus the tool result: the conversation goes on
    follow = oai.chat.completions.create(
        model="default", messages=[choice.message.model_dump(exclude_none=True), msg], tools=tools, **GREEDY
    )
    assert follow.choices[0].finish_reason in ("stop", "length")
