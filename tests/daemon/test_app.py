"""The ASGI app in-process (Starlette TestClient): auth on every route, bad input of every kind gets a
4xx with a message and changes nothing stored, the token file, the body cap."""

from __future__ import annotations

import stat

import pytest

from engramctl.daemon.auth import ensure_token, token_path
from engramctl.settings import load_settings
from tests.backends import both_backends, expected_build, weight_dtype
from tests.helpers import chat, served_app

TOKEN = "test-token-123"
USER = [{"role": "user", "content": "Hello there"}]
ROUTES = [  # every route but /health
    ("GET", "/v1/models"),
    ("GET", "/v1/models/default"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/status"),
    ("GET", "/v1/tiers"),
    ("GET", "/v1/sessions"),
    ("GET", "/v1/sessions/x"),
    ("DELETE", "/v1/sessions/x"),
    ("POST", "/save_snapshot"),
    ("POST", "/restore_snapshot"),
    ("POST", "/list_snapshots"),
    ("GET", "/list_snapshots"),
    ("POST", "/get_snapshot_info"),
    ("POST", "/delete_snapshot"),
    ("POST", "/branch_snapshot"),
    ("GET", "/nope"),
    ("POST", "/pin_snapshot"),
    ("POST", "/unpin_snapshot"),
    ("POST", "/label_snapshot"),
    ("POST", "/get_snapshot_transcript"),
    ("POST", "/gc_snapshots"),
    ("POST", "/import_snapshot"),
    ("POST", "/v1/sessions/x/reset"),
]


@pytest.fixture
def app_client(engine, engram_home):
    with served_app(engine, TOKEN, max_queue=2) as client:
        yield client


@pytest.fixture
def serial_client(engine, engram_home):
    """One turn at a time (serial_turns): one hot state, whatever the backend batches."""
    with served_app(engine, TOKEN, max_queue=2, serial_turns=True) as client:
        yield client


def _chat(client, **body):
    return client.post(
        "/v1/chat/completions", json={"model": "default", "messages": USER, "max_tokens": 3, "temperature": 0, **body}
    )


def _stored(client) -> dict:
    """Everything stored, to prove bad input changed nothing."""
    snaps = client.post("/list_snapshots", json={}).json()["snapshots"]
    sessions = client.get("/v1/sessions").json()["sessions"]
    transcripts = {s["name"]: client.get(f"/v1/sessions/{s['name']}").json()["messages"] for s in sessions}
    keep = ("snapshot_id", "session", "parent", "tokens", "pinned", "label")
    return {
        "snaps": [{k: s[k] for k in keep} for s in snaps],
        "sessions": [(s["name"], s["head"], s["n_messages"]) for s in sessions],
        "transcripts": transcripts,
    }


def test_every_route_but_health_needs_the_token(app_client):
    assert app_client.get("/health", headers={"Authorization": ""}).status_code == 200
    for method, path in ROUTES:
        for auth in ("", "Bearer wrong-token", f"Basic {TOKEN}", "Bearer"):
            r = app_client.request(method, path, headers={"Authorization": auth}, json={})
            assert r.status_code == 401, (method, path, auth, r.status_code)
            assert r.json()["error"]["type"] == "authentication_error"
            assert r.headers["www-authenticate"] == "Bearer"


@both_backends
def test_health_models_status(app_client, engine, backend):
    h = app_client.get("/health").json()
    assert h["status"] == "ok" and h["model"] == "tiny-gmh" and h["version"]
    models = app_client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny-gmh"]
    assert app_client.get("/v1/models/default").json()["id"] == "tiny-gmh"
    st = app_client.get("/v1/status").json()
    assert st["model"] == "tiny-gmh" and st["device"] == "cpu" and st["dtype"] == weight_dtype(backend)
    assert (st["backend"], st["weight_type"]) == (backend, weight_dtype(backend))
    assert st["rss_bytes"] > 0 and st["uptime_s"] >= 0 and st["sessions"] == 0
    assert st["weights_bytes"] == engine.info.weights_bytes > 0 and st["notices"] == []
    assert st["build"] == engine.info.build == expected_build(backend)
    tiers = app_client.get("/v1/tiers").json()
    assert [t["name"] for t in tiers["tiers"]] == ["vram", "ram", "disk"]


BAD_CHAT = [  # (body overrides, expected status, words the message must contain)
    ({"messages": []}, 400, "messages"),
    ({"messages": "hi"}, 400, "messages"),
    ({"messages": [{"content": "no role"}]}, 400, "role"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ({"messages": [{"role": "user", "content": 42}]}, 400, "content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "text"),
    ({"temperature": "hot"}, 400, "temperature"),
    ({"temperature": -1}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
    ({"max_tokens": -5}, 400, "max_tokens"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_completion_tokens": -1}, 400, "max_completion_tokens"),
    ({"max_tokens": "many"}, 400, "max_tokens"),
    ({"stop": ["a"] * 17}, 400, "stop"),
    ({"stop": 5}, 400, "stop"),
    ({"n": 2}, 400, "n=1"),
    ({"stream": "perhaps"}, 400, "stream"),
    ({"session": "../../etc/passwd"}, 400, "session name"),
    ({"session": "a" * 65}, 400, "session name"),
    ({"session": ""}, 400, "session name"),
    ({"session": 7}, 400, "session"),
    ({"max_tokens": 5000}, 400, "context"),
    ({"messages": [{"role": "user", "content": "word " * 5000}]}, 400, "context"),
]


@both_backends
def test_any_model_name_means_the_served_model(app_client):
    """One model is served: a request naming another (the original Engram server's README example asks
    for "granite-4.0-h-tiny") gets it, and the answer names the model that answered (as llama-server)."""
    for name in ("granite-4.0-h-tiny", "gpt-4o", "default"):
        r = _chat(app_client, model=name, session="named")
        assert r.status_code == 200, (name, r.text)
        assert r.json()["model"] == "tiny-gmh"
    with app_client.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "granite-4.0-h-tiny", "messages": USER, "max_tokens": 2, "stream": True},
    ) as r:
        assert r.status_code == 200
        import json

        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    assert chunks and {c["model"] for c in chunks} == {"tiny-gmh"}
    r = app_client.post(
        "/restore_snapshot",
        json={"model": "granite-4.0-h-tiny", "conversation_id": "named", "continuation": "Go on", "max_tokens": 2},
    )
    assert r.status_code == 200 and r.json()["model"] == "tiny-gmh", r.text
    assert r.json()["engram"]["resumed"]
    assert app_client.get("/v1/models/granite-4.0-h-tiny").status_code == 404  # a model card is only the served one's


def test_bad_chat_requests_get_4xx_and_change_nothing(app_client):
    ok = _chat(app_client, session="keep")
    assert ok.status_code == 200, ok.text
    before = _stored(app_client)
    for body, status, words in BAD_CHAT:
        for extra in ({}, {"session": "keep"}, {"stream": True}):
            r = _chat(app_client, **{**extra, **body})
            assert r.status_code == status, (body, extra, r.status_code, r.text)
            err = r.json()["error"]
            assert words.lower() in err["message"].lower(), (body, err)
            assert err["type"] and err["code"]
    assert _stored(app_client) == before
    assert _chat(app_client, session="keep").status_code == 200  # still serving


def test_malformed_bodies(app_client):
    h = {"Content-Type": "application/json"}
    for raw, words in (
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b"", "JSON object"),
        (b'"text"', "JSON object"),
        (b"\xff\xfe", "JSON"),
    ):
        for path in (
            "/v1/chat/completions",
            "/save_snapshot",
            "/restore_snapshot",
            "/branch_snapshot",
            "/delete_snapshot",
            "/get_snapshot_info",
            "/list_snapshots",
            "/pin_snapshot",
            "/unpin_snapshot",
            "/label_snapshot",
            "/get_snapshot_transcript",
        ):
            if path == "/list_snapshots" and raw == b"":
                continue  # an empty body is allowed there: list everything
            r = app_client.post(path, content=raw, headers=h)
            assert r.status_code == 400, (path, raw, r.text)
            assert words.lower() in r.json()["error"]["message"].lower(), (path, raw, r.json())
    # curl -d sends a form content type: the body is still read as JSON
    r = app_client.post(
        "/v1/chat/completions",
        content=b'{"model":"default","messages":[{"role":"user","content":"x"}],"max_tokens":2}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200, r.text


def test_body_size_cap(app_client):
    big = {"model": "default", "messages": [{"role": "user", "content": "x" * (9 * 2**20)}]}
    r = app_client.post("/v1/chat/completions", json=big)
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: counted while it arrives
        yield b'{"model": "default", "messages": [{"role": "user", "content": "'
        for _ in range(9):
            yield b"y" * 2**20
        yield b'"}]}'

    r = app_client.post("/v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text


def test_bad_snapshot_requests_get_4xx_and_change_nothing(app_client):
    first = _chat(app_client, session="keep").json()
    head = first["engram"]["snapshot_id"]
    before = _stored(app_client)
    cases = [
        ("/save_snapshot", {}, 400, "session"),
        ("/save_snapshot", {"session": "nobody"}, 404, "nobody"),
        ("/save_snapshot", {"session": "../x"}, 400, "session name"),
        ("/save_snapshot", {"session": "keep", "label": ""}, 400, "label"),
        ("/save_snapshot", {"session": "keep", "label": "x\n"}, 400, "label"),
        ("/save_snapshot", {"session": "keep", "conversation_id": "other"}, 400, "same thing"),
        ("/restore_snapshot", {}, 400, "snapshot_id"),
        ("/restore_snapshot", {"session": "nobody"}, 404, "nobody"),
        ("/restore_snapshot", {"snapshot_id": "f" * 32}, 404, "snapshot"),
        ("/restore_snapshot", {"snapshot_id": "../../x"}, 400, "snapshot id"),
        ("/restore_snapshot", {"snapshot_id": "zz"}, 400, "snapshot id"),
        ("/restore_snapshot", {"session": "keep", "continuation": "x", "max_tokens": -1}, 400, "max_tokens"),
        ("/restore_snapshot", {"session": "keep", "continuation": "word " * 5000}, 400, "context"),
        ("/list_snapshots", {"session": "nobody"}, 404, "nobody"),
        ("/list_snapshots", {"conversation_id": "bad/name"}, 400, "session name"),
        ("/get_snapshot_info", {}, 400, "snapshot_id"),
        ("/get_snapshot_info", {"snapshot_id": "0" * 32}, 404, "snapshot"),
        ("/get_snapshot_info", {"snapshot_id": "0123"}, 404, "0123"),
        ("/get_snapshot_info", {"session": "nobody"}, 404, "nobody"),
        ("/delete_snapshot", {}, 400, "snapshot_id"),
        ("/delete_snapshot", {"snapshot_id": "0" * 32}, 404, "snapshot"),
        ("/delete_snapshot", {"snapshot_id": head}, 409, "head"),
        ("/delete_snapshot", {"snapshot_id": "../" * 11}, 400, "snapshot id"),
        ("/branch_snapshot", {"source": "keep"}, 400, "new_session"),
        ("/branch_snapshot", {"source": "keep", "new_session": "keep"}, 409, "exists"),
        ("/branch_snapshot", {"source": "nobody", "new_session": "b"}, 404, "nobody"),
        ("/branch_snapshot", {"snapshot_id": "0" * 32, "new_session": "b"}, 404, "snapshot"),
        ("/branch_snapshot", {"source": "keep", "new_session": "a/b"}, 400, "session name"),
        ("/branch_snapshot", {"source": "keep", "snapshot_id": head, "new_session": "b"}, 400, "exactly one"),
        ("/pin_snapshot", {}, 400, "snapshot_id"),
        ("/pin_snapshot", {"snapshot_id": "0" * 32}, 404, "snapshot"),
        ("/pin_snapshot", {"snapshot_id": "zz"}, 400, "snapshot id"),
        ("/pin_snapshot", {"snapshot_id": head, "label": "x\n"}, 400, "label"),  # refused before pinning
        ("/unpin_snapshot", {"snapshot_id": "../x"}, 400, "snapshot id"),
        ("/label_snapshot", {"snapshot_id": head}, 400, "label"),
        ("/label_snapshot", {"snapshot_id": head, "label": ""}, 400, "label"),
        ("/get_snapshot_transcript", {"snapshot_id": "0123"}, 404, "0123"),
        ("/get_snapshot_transcript", {}, 400, "snapshot_id"),
    ]
    for path, body, status, words in cases:
        r = app_client.post(path, json=body)
        assert r.status_code == status, (path, body, r.status_code, r.text)
        assert words.lower() in r.json()["error"]["message"].lower(), (path, body, r.json())
    for content, query, status, words in (
        (b"", "", 400, "snapshot file"),
        (b"junk", "", 409, "truncated"),
        (b"junk", "?session=../x", 400, "session name"),
    ):
        r = app_client.post(
            f"/import_snapshot{query}", content=content, headers={"Content-Type": "application/octet-stream"}
        )
        assert r.status_code == status and words in r.json()["error"]["message"], (query, r.text)
    for method, path, status in (
        ("POST", "/v1/sessions/nobody/reset", 404),
        ("POST", "/v1/sessions/a..b$/reset", 400),
        ("GET", "/v1/sessions/nobody", 404),
        ("GET", "/v1/sessions/a..b$", 400),
        ("DELETE", "/v1/sessions/nobody", 404),
        ("GET", "/v1/nothing", 404),
        ("PUT", "/v1/chat/completions", 405),
        ("GET", "/v1/models/other", 404),
    ):
        r = app_client.request(method, path)
        assert r.status_code == status, (method, path, r.text)
        assert r.json()["error"]["message"]
    assert _stored(app_client) == before


@both_backends
def test_stream_answer_shape(app_client):
    with app_client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": "default",
            "messages": USER,
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    import json

    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    first, last_choice, usage = chunks[0], chunks[-2], chunks[-1]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["engram"]["snapshot_id"] is None and first["engram"]["session"].startswith("auto-")
    assert last_choice["choices"][0]["finish_reason"] in ("stop", "length") and "engram" not in last_choice
    # the recorded turn's `engram` (its snapshot) trails the finish, with the usage (issue 18)
    assert usage["engram"]["snapshot_id"] and usage["choices"] == []
    assert usage["usage"]["prompt_tokens"] > 0 and "cached_tokens" in usage["usage"]["prompt_tokens_details"]


def test_token_file_is_created_0600_and_env_key_overrides(engram_home):
    settings = load_settings({})
    token = ensure_token(settings)
    path = token_path(settings)
    assert len(token) >= 32 and path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_token(settings) == token  # stable across starts
    path.chmod(0o644)
    assert ensure_token(settings) == token and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_token(load_settings({}, env={"ENGRAM_HOME": str(engram_home), "ENGRAM_API_KEY": "k"})) == "k"


def test_non_loopback_host_needs_allow_remote(engram_home):
    from engramctl.daemon.runner import check_host
    from engramctl.errors import UsageError

    check_host(load_settings({"host": "127.0.0.1"}))
    check_host(load_settings({"host": "localhost"}))
    check_host(load_settings({"host": "::1"}))
    with pytest.raises(UsageError, match="reachable from other machines") as e:
        check_host(load_settings({"host": "0.0.0.0"}))
    assert "--allow-remote" in e.value.hint
    check_host(load_settings({"host": "0.0.0.0", "allow_remote": True}))


def _corrupt(path):
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])
    path.write_bytes(bytes(data))


@both_backends
def test_corrupt_head_falls_back_one_step_then_to_the_transcript(engine, engram_home):
    with served_app(engine, TOKEN, tier_ram_bytes=0) as c:  # nothing hot: loads read the files
        daemon, store = c.daemon, c.daemon.store

        def turn(text):
            r = chat(c, "c", text, max_tokens=3)
            store.flush()
            daemon.service.invalidate()  # as after a restart: no state in memory
            return r

        turn("one")
        second = turn("two")
        head = second["engram"]["snapshot_id"]
        _corrupt(store._files.path(head))
        third = turn("three")
        # the corrupt reply snapshot is dropped; its parent (the prompt snapshot of turn 2) is used
        assert third["engram"]["resumed"] and third["engram"]["tier"] == "disk"
        assert third["engram"]["restored_tokens"] == second["usage"]["prompt_tokens"]
        assert head not in {s["snapshot_id"] for s in c.post("/list_snapshots", json={}).json()["snapshots"]}
        for s in c.post("/list_snapshots", json={"session": "c"}).json()["snapshots"]:
            _corrupt(store._files.path(s["snapshot_id"]))
        fourth = turn("four")
        assert not fourth["engram"]["resumed"] and fourth["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        msgs = c.get("/v1/sessions/c").json()["messages"]
        assert [m["content"] for m in msgs if m["role"] == "user"] == ["one", "two", "three", "four"]
        # the re-prefilled state matches the conversation: the next turn continues it
        assert turn("five")["engram"]["restored_tokens"] > fourth["usage"]["prompt_tokens"]


@both_backends
def test_import_is_verified_against_the_loaded_model_and_stores_nothing_when_refused(app_client, engine):
    from engramctl.store import exchange
    from tests.cli.conftest import make_payload

    first = _chat(app_client, session="src").json()
    sid, tokens = first["engram"]["snapshot_id"], first["usage"]["total_tokens"]
    store = app_client.app.state.daemon.store
    messages = app_client.post("/get_snapshot_transcript", json={"snapshot_id": sid[:24]}).json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    own = exchange.pack(store.snapshots.load(sid), messages, "src")
    tensors, meta = make_payload(8, fingerprint="another-model")
    meta.update(backend=engine.spec.backend, state_format=engine.spec.state_format)  # another model, same backend
    alien = exchange.pack((tensors, meta), [{"role": "user", "content": "x"}], "alien")
    raw = {"Content-Type": "application/octet-stream"}
    before = _stored(app_client)
    r = app_client.post("/import_snapshot", content=alien, headers=raw)
    err = r.json()["error"]
    assert r.status_code == 409 and err["code"] == "snapshot_mismatch" and "fingerprint" in err["message"], r.text
    assert "daemon start --model test/tiny-hybrid" in err["hint"] and "tiny-gmh" in err["message"]
    r = app_client.post("/import_snapshot", content=own, headers=raw)  # the session it records exists
    assert r.status_code == 409 and r.json()["error"]["code"] == "already_exists"
    assert _stored(app_client) == before
    r = app_client.post("/import_snapshot?session=copy&label=imported", content=own, headers=raw)
    assert r.status_code == 200, r.text
    imp = r.json()
    assert imp["session"] == "copy" and imp["label"] == "imported" and imp["tokens"] == tokens
    assert imp["messages"] == 2 and imp["durable"] and imp["snapshot_id"] != sid
    assert app_client.get("/v1/sessions/copy").json()["messages"] == messages
    cont = _chat(app_client, session="copy", messages=[{"role": "user", "content": "And?"}]).json()
    assert cont["engram"]["restored_tokens"] == tokens and cont["engram"]["resumed"]


def test_load_model_logs_the_fallback_notice_and_keeps_it(zoo, engram_home, monkeypatch, caplog):
    from engramctl.daemon import model as daemon_model
    from engramctl.engine import models

    def fallback(cache_dir, say=None, **_choice):  # device= and backend= pick among defaults
        say("the default model is not available offline; using the fallback.")
        return str(zoo.path("granitemoehybrid"))

    monkeypatch.setattr(models, "default_model_ref", fallback)
    with caplog.at_level("WARNING", logger="engramctl.daemon"):
        engine = daemon_model.load_model(load_settings({"device": "cpu", "dtype": "float32"}))
    assert engine.notices == ["the default model is not available offline; using the fallback."]
    assert "not available offline" in caplog.text


@both_backends
def test_dropped_states_are_released_once_and_the_hot_one_never(serial_client, engine, monkeypatch):
    """A llama.cpp backend frees a state's memory on release: every Live the daemon stops needing is
    released (replaced as hot, reset, refused turn), once, and never the one it keeps hot. With one hot
    state (serial_turns) the replaced one goes at once; test_scheduler covers several kept hot."""
    app_client = serial_client
    daemon = app_client.app.state.daemon
    released: list = []
    real = engine.backend.release

    def spy(live):
        hot = daemon.service.hot
        assert hot is None or hot.live is not live, "released the state still kept hot"
        assert all(x is not live for x in released), "released twice"
        released.append(live)
        real(live)

    monkeypatch.setattr(engine.backend, "release", spy)
    assert _chat(app_client, session="a").json()["engram"]["tier"] is None
    a1 = daemon.service.hot.live
    assert released == []
    _chat(app_client, session="b")
    assert released == [a1]  # a's state is on disk and in RAM; b's is hot now
    b1 = daemon.service.hot.live
    assert _chat(app_client, session="a").json()["engram"]["tier"] in ("ram", "vram", "disk")
    assert released == [a1, b1]
    a2 = daemon.service.hot.live
    assert _chat(app_client, session="a").json()["engram"]["tier"] == "live"
    assert released == [a1, b1] and daemon.service.hot.live is a2  # continued in place
    too_long = "word " * (engine.info.context_length + 100)  # 4096 on transformers; llama.cpp's context is 32768
    r = _chat(app_client, session="b", messages=[{"role": "user", "content": too_long}])
    assert r.status_code == 400 and len(released) == 3  # the state loaded for the refused turn
    assert daemon.service.hot.live is a2  # a refused turn leaves the hot state hot
    assert app_client.post("/v1/sessions/a/reset").status_code == 200
    assert daemon.service.hot is None and released[-1] is a2
    assert all(live.cache is None for live in released)
