"""The rules that cross the wire, each defined once: the framework parses JSON bodies (a body that is not
UTF-8 is a 400 like any bad JSON), the Engram adapter's names, the protocol's snapshot fields, the
shortest id prefix, and whether a session exists. In-process app (Starlette TestClient), tiny model."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from engramctl.agent.arguments import validate_arguments
from engramctl.agent.tools import TOOLS
from engramctl.daemon.engram_api import answers
from engramctl.errors import ToolArgumentError
from engramctl.protocol import Session, Snapshot
from engramctl.store.names import MIN_ID_PREFIX
from tests.helpers import chat, served_app

TOKEN = "wire-token"
# The routes that parse a JSON body: /gc_snapshots reads none and /import_snapshot reads raw file bytes.
JSON_ROUTES = (
    "/v1/chat/completions",
    *sorted(answers.ROUTES - {"/gc_snapshots", "/import_snapshot"}),
    "/v1/agent/call",
)
ENGRAM_ROUTES = {"/save_snapshot", "/restore_snapshot", "/list_snapshots", "/get_snapshot_info", "/delete_snapshot"}


@pytest.fixture
def client(engine, engram_home):
    with served_app(engine, TOKEN) as c:
        yield c


def _turn(client, session: str) -> str:
    return chat(client, session, "Hi", max_tokens=3)["engram"]["snapshot_id"]


def test_a_body_that_is_not_utf8_is_a_400_with_the_error_shape(client):
    sid = _turn(client, "keep")
    for raw in (b'{"session": "\xff"}', b"\xff", b'{"snapshot_id": "\xc3\x28"}'):
        for path in JSON_ROUTES:
            r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
            assert r.status_code == 400, (path, raw, r.status_code, r.text)
            err = r.json()["error"]
            assert "not valid JSON" in err["message"] and "UTF-8" in err["message"], (path, r.json())
            assert err["type"] == "invalid_request_error" and err["code"] == "invalid_request_error"
    assert client.post("/get_snapshot_info", json={"snapshot_id": sid}).status_code == 200  # nothing touched


def test_list_snapshots_takes_a_query_or_an_optional_body(client):
    sid = _turn(client, "listed")
    everything = client.post("/list_snapshots").json()["snapshots"]
    assert sid in [s["snapshot_id"] for s in everything]
    for r in (
        client.get("/list_snapshots", params={"conversation_id": "listed"}),
        client.post("/list_snapshots", json={"session": "listed"}),
        client.post("/list_snapshots", json=None),
    ):
        assert r.status_code == 200 and sid in [s["snapshot_id"] for s in r.json()["snapshots"]], r.text
    for r, status, words in (
        (client.get("/list_snapshots", params={"session": "nobody"}), 404, "nobody"),
        (client.get("/list_snapshots", params={"session": "a/b"}), 400, "session name"),
        (client.get("/list_snapshots", params={"session": "a", "conversation_id": "b"}), 400, "same thing"),
    ):
        assert r.status_code == status and words in r.json()["error"]["message"], r.text


def test_engram_routes_alone_speak_engram(client):
    """`success`, `message` and `conversation_id` come from the adapter, on the snapshot routes only."""
    sid = _turn(client, "names")
    info = client.post("/get_snapshot_info", json={"conversation_id": "names"}).json()
    assert info["success"] is True and info["conversation_id"] == info["session"] == "names"
    assert info["snapshot_id"] == sid
    for path in ENGRAM_ROUTES:
        r = client.post(path, json={"session": "nobody", "snapshot_id": "f" * 32})
        body = r.json()
        assert r.status_code in (400, 404) and body["success"] is False, (path, body)
        assert body["message"] == body["error"]["message"]
    refused = client.post("/list_snapshots", headers={"Authorization": "Bearer wrong"})  # the auth middleware's
    assert refused.status_code == 401 and refused.json()["success"] is False and refused.json()["message"]
    other = client.get("/v1/sessions/nobody").json()
    assert other["error"]["message"] and "success" not in other and "message" not in other
    body = {"model": "default", "session": "names", "max_tokens": 2, "messages": [{"role": "user", "content": "More"}]}
    done = client.post("/v1/chat/completions", json=body).json()
    assert "success" not in done and "conversation_id" not in done["engram"]


def test_the_wire_snapshot_is_the_stores_record(client):
    """One definition of the fields: what the routes send reads back (protocol.Snapshot.from_json) as
    exactly the store's record, and a session likewise."""
    _turn(client, "fields")
    store = client.daemon.store
    assert store.flush(timeout=30)  # the disk writes done: tiers and durability stay put while we compare
    listed = client.post("/list_snapshots", json={"session": "fields"}).json()["snapshots"]
    assert len(listed) >= 2
    for item in listed:
        snap = Snapshot.from_json(item)
        assert snap == Snapshot.from_record(store.snapshots.info(snap.id))
        assert snap.to_dict() == store.snapshots.info(snap.id).to_json()
        assert Snapshot.from_json(snap.to_json()) == snap
    session = Session.from_json(client.get("/v1/sessions/fields").json())
    assert session == Session.from_info(store.sessions.get("fields"))


def test_a_turn_on_the_wire_is_protocol_turninfo(client):
    """The `engram` extension carries protocol.TurnInfo's fields: the origin in the first chunk, all of
    them in the last; the client reads them back as they were sent."""
    from dataclasses import fields

    from engramctl.protocol import TurnInfo

    names = {f.name for f in fields(TurnInfo)}
    body = {
        "model": "default",
        "session": "turn",
        "max_tokens": 3,
        "temperature": 0,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    extensions = [c["engram"] for c in chunks if "engram" in c]
    assert len(extensions) == 2 and set(extensions[0]) <= names and set(extensions[-1]) == names
    last = TurnInfo.from_json(extensions[-1])
    assert last.to_json() == extensions[-1] and last.session == "turn" and last.snapshot_id
    assert last.finish_reason in ("stop", "length") and 0 < last.completion_tokens <= 3


def test_the_shortest_id_prefix_is_one_rule(client):
    """store.names.MIN_ID_PREFIX, for the routes, the agent tools' schema and the store alike."""
    sid = _turn(client, "prefix")
    short, at_min = sid[: MIN_ID_PREFIX - 1], sid[:MIN_ID_PREFIX]
    for ref in (short, at_min):  # ids start with a millisecond time: the prompt and reply snapshots share it
        r = client.post("/get_snapshot_info", json={"snapshot_id": ref})
        assert r.status_code == 400 and "too short" in r.json()["error"]["message"], (ref, r.text)
    assert client.post("/get_snapshot_info", json={"snapshot_id": sid[:24]}).json()["snapshot_id"] == sid
    assert client.post("/get_snapshot_info", json={"snapshot_id": "0" * MIN_ID_PREFIX}).status_code == 404
    schema = TOOLS["delete_checkpoint"].parameters["properties"]["id"]
    assert schema["minLength"] == MIN_ID_PREFIX and f"{{{MIN_ID_PREFIX},32}}" in schema["pattern"]
    assert validate_arguments("delete_checkpoint", {"id": at_min}) == {"id": at_min}
    with pytest.raises(ToolArgumentError):
        validate_arguments("delete_checkpoint", {"id": short})
    r = client.post("/v1/agent/call", json={"tool": "delete_checkpoint", "arguments": {"id": at_min}})
    assert r.status_code == 400 and "too short" in r.json()["error"]["message"], r.text


def test_a_session_named_like_an_id_prefix_is_the_session(client):
    """Sessions.has decides for /branch_snapshot and the agent's branch tool alike."""
    sid = _turn(client, "prefix-owner")
    name = sid[:8]
    _turn(client, name)
    store = client.daemon.store
    assert store.sessions.has(name) and not store.sessions.has("nobody") and not store.sessions.has("../x")
    head = store.sessions.get(name).head
    assert client.post("/branch_snapshot", json={"source": name, "new_session": "b1"}).json()["head"] == head
    call = client.post("/v1/agent/call", json={"tool": "branch", "arguments": {"source": name, "new_session": "b2"}})
    assert call.json()["result"]["snapshot_id"] == head and call.json()["result"]["source_session"] == name
    by_prefix = client.post("/branch_snapshot", json={"source": sid[:24], "new_session": "b3"}).json()
    assert by_prefix["head"] == sid


def test_openapi_document_lists_every_route_behind_the_token(client):
    served = {r.path for r in client.app.routes if getattr(r, "include_in_schema", False)}
    doc = client.get("/openapi.json")
    assert doc.status_code == 200
    documented = set(doc.json()["paths"])
    assert served <= documented and {"/v1/chat/completions", "/restore_snapshot"} <= documented
    anonymous = TestClient(client.app, raise_server_exceptions=False)
    refused = anonymous.get("/openapi.json")
    assert refused.status_code == 401 and "error" in refused.json()
