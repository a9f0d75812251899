"""API fuzz, bounded (issue 12 item 1): a real daemon (tests/daemon/conftest.py) given schema-driven cases
of every route in its /openapi.json (schemathesis, with the token), raw garbage bodies, damaged snapshot
files through POST /import_snapshot, and malformed WebSocket frames. No answer is >= 500, every error is
the documented ErrorBody JSON, and afterwards the daemon still serves and every snapshot stored before
the fuzz is listed and verifies against its checksum.

The long run (>= 10,000 cases) is scripts/fuzz_api.py; figures in RELIABILITY.md section 1. The harness
is tests/api_fuzz.py.
"""

from __future__ import annotations

import httpx
import pytest

from tests import api_fuzz
from tests.daemon.conftest import start_daemon

SEEDED = ["keep-fuzz-7c1e", "keep-fuzz-7c1e-b"]


@pytest.fixture(scope="module")
def daemon(model_dir, tmp_path_factory):
    d = start_daemon(model_dir, tmp_path_factory.mktemp("fuzz-home"))
    try:
        with d.http() as c:
            for text in ("one", "two"):
                r = c.post(
                    "/v1/chat/completions",
                    json={"session": SEEDED[0], "max_tokens": 3, "messages": [{"role": "user", "content": text}]},
                )
                assert r.status_code == 200, r.text
            assert c.post("/save_snapshot", json={"session": SEEDED[0], "label": "kept"}).status_code == 200
            r = c.post("/branch_snapshot", json={"source": SEEDED[0], "new_session": SEEDED[1]})
            assert r.status_code == 200, r.text
        before = api_fuzz.Stored.read(d.url, d.token, d.home, SEEDED)
        assert before.snapshots and not before.verify(d.home)
        d.before = before
        yield d
    finally:
        d.stop()


def _assert_ok(d, findings: api_fuzz.Findings) -> None:
    """No 5xx, every error an ErrorBody; the daemon serves; what was stored before is intact."""
    summary = findings.summary()
    assert summary["responses_5xx"] == 0 and not findings.problems, summary
    assert httpx.get(f"{d.url}/health", timeout=10).status_code == 200
    after = api_fuzz.Stored.read(d.url, d.token, d.home, SEEDED)
    assert set(d.before.snapshots) <= set(after.snapshots), "a snapshot stored before the fuzz is gone"
    assert after.transcripts == d.before.transcripts
    assert not after.verify(d.home)
    assert d.proc.poll() is None, d.log_text()[-2000:]


def test_openapi_document_says_what_the_daemon_does(daemon):
    with daemon.http() as c:
        doc = c.get("/openapi.json").json()
        invalid = c.post("/save_snapshot", json={"session": "../x"})
    operations = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    expected = {
        ("GET", "/health"),
        ("GET", "/v1/models"),
        ("GET", "/v1/models/{model}"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/status"),
        ("GET", "/v1/tiers"),
        ("POST", "/v1/snapshots/freed_bytes"),
        ("GET", "/v1/sessions"),
        ("GET", "/v1/sessions/{name}"),
        ("DELETE", "/v1/sessions/{name}"),
        ("POST", "/v1/sessions/{name}/reset"),
        ("GET", "/list_snapshots"),
        ("GET", "/v1/agent/tools"),
        ("POST", "/v1/agent/call"),
        ("POST", "/v1/completions"),
        ("POST", "/api/chat"),
        ("POST", "/api/generate"),
        ("POST", "/api/show"),
        ("GET", "/api/tags"),
        ("GET", "/api/ps"),
        ("GET", "/api/version"),
    } | {("POST", p) for p in api_fuzz.ENGRAM_ROUTES}
    assert operations == expected
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert doc["security"] == [{"bearer": []}] and doc["paths"]["/health"]["get"]["security"] == []
    import jsonschema

    error_schema = doc["components"]["schemas"]["ErrorBody"]
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert "422" not in op["responses"], path  # validation failures are 400 ErrorBody here
            if path != "/health":
                assert op["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    body = doc["paths"]["/import_snapshot"]["post"]["requestBody"]
    assert body["required"] and "application/octet-stream" in body["content"]
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    assert invalid.status_code == 400
    jsonschema.validate(invalid.json(), error_schema)


def test_openapi_documents_completions_ollama_and_every_sampling_option(daemon):
    """Issue 20 item 7: the new routes' bodies and the new sampling options are in the document, with bounds."""
    with daemon.http() as c:
        doc = c.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]

    def body(path: str) -> dict:
        ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        return schemas[ref.rsplit("/", 1)[1]]

    def bounds(prop: dict) -> dict:
        number = next(s for s in prop.get("anyOf", [prop]) if s.get("type") in ("number", "integer", "object"))
        return {k: v for k, v in number.items() if k in ("minimum", "maximum", "exclusiveMinimum", "maxProperties")}

    chat, completion = body("/v1/chat/completions")["properties"], body("/v1/completions")["properties"]
    for props in (chat, completion):
        assert bounds(props["min_p"]) == {"minimum": 0, "maximum": 1}
        assert bounds(props["presence_penalty"]) == bounds(props["frequency_penalty"]) == {"minimum": -2, "maximum": 2}
        assert bounds(props["repeat_penalty"]) == {"exclusiveMinimum": 0, "maximum": 2}
        assert bounds(props["logit_bias"]) == {"maxProperties": 1024}
        bias = next(s for s in props["logit_bias"]["anyOf"] if s.get("type") == "object")
        assert bias["propertyNames"] == {"pattern": "^[0-9]{1,9}$"}
        assert bias["additionalProperties"] == {"type": "number", "minimum": -100, "maximum": 100}
    assert {"prompt", "suffix", "echo", "stream", "stop", "max_tokens", "seed"} <= set(completion)
    options = schemas["OllamaOptions"]["properties"]
    assert {
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repeat_penalty",
        "seed",
        "num_predict",
        "num_ctx",
        "stop",
    } <= set(options)
    assert {"prompt", "suffix", "system", "context", "raw", "format", "keep_alive", "options"} <= set(
        body("/api/generate")["properties"]
    )
    assert {"messages", "format", "keep_alive", "options", "stream"} <= set(body("/api/chat")["properties"])
    for path in ("/api/tags", "/api/ps", "/api/version"):
        assert "4XX" in doc["paths"][path]["get"]["responses"]


def test_schema_driven_fuzz_of_every_route(daemon):
    findings = api_fuzz.Findings()
    api_fuzz.schema_cases(daemon.url, daemon.token, findings, per_operation=4)
    assert findings.cases >= 150, findings.summary()
    assert set(findings.by_source) == {"schema:positive", "schema:negative"}
    _assert_ok(daemon, findings)


def test_garbage_bodies_get_a_4xx_error_body(daemon):
    findings = api_fuzz.Findings()
    api_fuzz.garbage_requests(daemon.url, daemon.token, findings)
    assert findings.by_status[413] >= len(api_fuzz.POST_ROUTES) * 3  # the 8 MiB+ bodies
    _assert_ok(daemon, findings)


def test_damaged_snapshot_files_are_refused_on_import(daemon):
    head = api_fuzz.Stored.read(daemon.url, daemon.token, daemon.home, SEEDED)
    with daemon.http() as c:
        sid = c.get(f"/v1/sessions/{SEEDED[0]}").json()["head"]
    base = (daemon.home / "snapshots" / f"{sid}.safetensors").read_bytes()
    assert head.snapshots
    findings = api_fuzz.Findings()
    outcomes = api_fuzz.import_cases(daemon.url, daemon.token, findings, base, n=60)
    refused = sum(n for (_kind, status), n in outcomes.items() if 400 <= status < 500)
    assert refused >= 50, outcomes
    with daemon.http() as c:  # the intact file still imports: the route works, it refuses only damage
        r = c.post("/import_snapshot?session=imp-intact", content=base)
        assert r.status_code == 200, r.text
    _assert_ok(daemon, findings)


def test_malformed_websocket_frames_get_error_events(daemon):
    findings = api_fuzz.Findings()
    api_fuzz.ws_cases(daemon.url, daemon.token, findings)
    assert findings.cases >= len(api_fuzz.ws_frames())
    _assert_ok(daemon, findings)


def test_websocket_type_that_is_a_list_keeps_the_connection(daemon):
    """Regression: {"type": [...]} raised TypeError (unhashable) in the handler and dropped the connection."""
    import json

    from websockets.sync.client import connect

    url = daemon.url.replace("http://", "ws://") + "/v1/agent/ws"
    with connect(url, additional_headers={"Authorization": f"Bearer {daemon.token}"}) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "ready"
        for bad in (["chat"], {"a": 1}):
            ws.send(json.dumps({"type": bad, "id": 7}))
            event = json.loads(ws.recv(timeout=30))
            assert event["type"] == "error" and event["error"]["param"] == "type", event
            assert "must be a string" in event["error"]["message"]
        ws.send(json.dumps({"type": "ping", "id": 8}))
        assert json.loads(ws.recv(timeout=30)) == {"type": "pong", "id": 8}


def test_a_tiny_temperature_or_top_p_is_answered_not_500(daemon):
    """Regression: the schema fuzz sent top_p 5e-324 (> 0, so valid): float32 compared 0 < 0 and kept no token;
    temperature 5e-324 made the float32 scores NaN. The daemon answered 500; it samples the best token now."""
    with daemon.http() as c:
        for extra in (
            {"temperature": 5e-324},
            {"temperature": 5e-324, "top_k": 3},
            {"top_p": 5e-324, "temperature": 1},
        ):
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            greedy = c.post("/v1/chat/completions", json={**body, "temperature": 0})
            assert r.json()["choices"][0]["message"] == greedy.json()["choices"][0]["message"]


def test_a_wrong_method_names_every_allowed_one(daemon):
    """Regression (schemathesis ST205): a 405's Allow named only the first route of a path that has one
    route per method (GET and POST /list_snapshots)."""
    with daemon.http() as c:
        for method, path, allowed in (
            ("OPTIONS", "/list_snapshots", "GET, POST"),
            ("PUT", "/v1/sessions/x", "DELETE, GET"),
            ("GET", "/save_snapshot", "POST"),
        ):
            r = c.request(method, path)
            assert r.status_code == 405 and r.headers["allow"] == allowed, (method, path, r.headers, r.text)
            assert not api_fuzz.error_shape_problem(f"{method} {path}", 405, r.headers["content-type"], r.content)
