"""The API fuzz (issue 12 item 1), shared by the bounded test (tests/daemon/test_fuzz_api.py) and the long
run (scripts/fuzz_api.py). Everything goes to a real daemon over HTTP and WebSocket:

- schema-driven cases of every operation in its /openapi.json (schemathesis, positive and negative
  generation, with the bearer token);
- raw garbage bodies to every POST route: invalid UTF-8, deep nesting, huge numbers, NaN, wrong content
  types, broken or lying Content-Length, 8 MiB+ bodies;
- damaged snapshot files to POST /import_snapshot (tests/snapshot_mutations.py);
- malformed WebSocket frames to /v1/agent/ws.

Every HTTP answer must be < 500 and, when it is an error, the documented ErrorBody JSON (with the Engram
routes' `success: false` and `message`); every WebSocket error an `error` event, the connection still up.
`Findings` collects what broke the rules; `Stored` proves the snapshots stored before are intact after.
"""

from __future__ import annotations

import collections
import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from engramctl.daemon.engram_api.answers import ROUTES as ENGRAM_ROUTES
from engramctl.store import snapshot_file

# Generation requests the fuzz sends are capped so that a case costs milliseconds on the tiny model: the
# document's own bounds stay, these only narrow what schemathesis draws (negative cases still go past them).
_GENERATION_CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "max_new_tokens": 4, "num_predict": 4}
_LIST_CAPS = {"continuation_ids": 16, "messages": 4, "stop": 4, "context": 16}
OLLAMA_GENERATING = ("/api/chat", "/api/generate")


def fuzz_document(url: str, token: str) -> dict:
    doc = httpx.get(f"{url}/openapi.json", headers={"Authorization": f"Bearer {token}"}, timeout=30).json()
    return _narrowed(json.loads(json.dumps(doc)))


def _narrowed(node: Any) -> Any:
    if isinstance(node, dict):
        props = node.get("properties")
        if isinstance(props, dict):
            for name, cap in _GENERATION_CAPS.items():
                if name in props:
                    props[name] = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": cap}, {"type": "null"}]}
            for name, cap in _LIST_CAPS.items():
                if isinstance(props.get(name), dict):
                    props[name] = {**props[name], "maxItems": cap}
        for v in node.values():
            _narrowed(v)
    elif isinstance(node, list):
        for v in node:
            _narrowed(v)
    return node


# -- the rules every answer must keep -----------------------------------------------------------------------------
@dataclass
class Findings:
    cases: int = 0
    by_status: collections.Counter = field(default_factory=collections.Counter)
    by_source: collections.Counter = field(default_factory=collections.Counter)
    problems: list[str] = field(default_factory=list)
    slowest_s: float = 0.0
    slowest: str = ""

    def http(self, source: str, what: str, status: int, headers: Any, body: bytes, elapsed_s: float) -> None:
        refused = refused_before_app(status, body)
        self.cases += 1
        self.by_status[refused or status] += 1
        self.by_source[source] += 1
        if elapsed_s > self.slowest_s:
            self.slowest_s, self.slowest = elapsed_s, what
        if refused:
            return
        problem = error_shape_problem(what, status, headers.get("content-type", ""), body)
        if problem:
            self.problems.append(problem)

    def ws(self, what: str, problem: str | None) -> None:
        self.cases += 1
        self.by_source["websocket"] += 1
        if problem:
            self.problems.append(f"{what}: {problem}")

    def summary(self) -> dict:
        return {
            "cases": self.cases,
            "by_source": dict(self.by_source),
            "by_status": {str(k): v for k, v in sorted(self.by_status.items(), key=lambda kv: str(kv[0])) if v},
            "responses_5xx": sum(n for s, n in self.by_status.items() if isinstance(s, int) and s >= 500),
            "problems": len(self.problems),
            "first_problems": self.problems[:10],
            "slowest_case_s": round(self.slowest_s, 3),
            "slowest_case": self.slowest[:200],
        }


def refused_before_app(status: int, body: bytes) -> str | None:
    """uvicorn's HTTP parser refused a request that breaks HTTP's grammar (the request line, a header with a
    control byte) before any route ran: a protocol error, answered as uvicorn answers it, not an API error."""
    if status == 400 and body.strip() == b"Invalid HTTP request received.":
        return "400 (uvicorn, before the app)"
    return None


def error_shape_problem(what: str, status: int, content_type: str, body: bytes) -> str | None:
    """What is wrong with one answer, or None: < 500, and an error is ErrorBody JSON."""
    if status >= 500:
        return f"{what}: HTTP {status}: {body[:300]!r}"
    if status < 400:
        return None
    if not content_type.startswith("application/json"):
        return f"{what}: HTTP {status} with content type {content_type!r}"
    try:
        doc = json.loads(body)
    except ValueError:
        return f"{what}: HTTP {status} body is not JSON: {body[:200]!r}"
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict):
        return f"{what}: HTTP {status} body has no error object: {body[:200]!r}"
    if not isinstance(err.get("message"), str) or not err["message"].strip():
        return f"{what}: HTTP {status} error without a message"
    if not isinstance(err.get("type"), str) or not all(k in err for k in ("code", "param")):
        return f"{what}: HTTP {status} error lacks type/code/param: {err}"
    path = what.split(" ", 2)[1].split("?")[0] if what.count(" ") >= 1 else ""
    if path in ENGRAM_ROUTES and (doc.get("success") is not False or doc.get("message") != err["message"]):
        return f"{what}: HTTP {status} on an Engram route without success: false and message"
    return None


# -- schema-driven cases ----------------------------------------------------------------------------------------
def schema_cases(url: str, token: str, findings: Findings, per_operation: int, seed: int = 0) -> None:
    """`per_operation` cases of each operation and generation mode (positive, negative), sent for real."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed
    from hypothesis.errors import Unsatisfiable
    from schemathesis.generation import GenerationMode

    schema = schemathesis.openapi.from_dict(fuzz_document(url, token))
    auth = {"Authorization": f"Bearer {token}"}
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            def one(case) -> None:
                body = getattr(case, "body", None)
                if isinstance(body, dict) and not any(k in body for k in _GENERATION_CAPS):
                    # absent means "as long as the context allows": seconds per case on the tiny model
                    body["max_tokens"] = 4
                if isinstance(body, dict) and case.path in OLLAMA_GENERATING:
                    options = body.setdefault("options", {})  # Ollama's max_tokens is options.num_predict
                    if isinstance(options, dict) and not isinstance(options.get("num_predict"), int):
                        options["num_predict"] = 4
                t0 = time.perf_counter()
                resp = case.call(base_url=url, headers=auth, timeout=120)
                what = f"{case.method.upper()} {case.formatted_path} [{mode.value}] {_short(case)}"
                findings.http(
                    f"schema:{mode.value}",
                    what,
                    resp.status_code,
                    resp.headers_lower if hasattr(resp, "headers_lower") else _lower(resp.headers),
                    resp.content,
                    time.perf_counter() - t0,
                )

            run = settings(
                max_examples=per_operation,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )(hseed(seed)(given(op.as_strategy(generation_mode=mode))(one)))
            try:
                run()
            except Unsatisfiable:
                pass  # an operation with no input has no negative case


def _lower(headers: Any) -> dict[str, str]:
    out = {}
    for k, v in dict(headers).items():
        out[k.lower()] = v[0] if isinstance(v, list) else v
    return out


def _short(case) -> str:
    body = getattr(case, "body", None)
    text = repr(body)
    return text if len(text) < 160 else text[:157] + "..."


# -- raw garbage ------------------------------------------------------------------------------------------------
# garbage_requests sends its lying Content-Length and chunked bodies to the first four only: chat and the
# Engram save, restore and list. The rest follow sorted, so every run sends in the same order.
_FIRST = ("/v1/chat/completions", "/save_snapshot", "/restore_snapshot", "/list_snapshots")
POST_ROUTES = [
    *_FIRST,
    *sorted(ENGRAM_ROUTES - set(_FIRST)),
    "/v1/agent/call",
    "/v1/sessions/fuzz-none/reset",
    "/v1/completions",
    "/api/chat",
    "/api/generate",
    "/api/show",
]
MiB = 2**20


def garbage_bodies() -> list[tuple[str, bytes, dict[str, str]]]:
    """(name, body, extra headers): every kind of body a JSON route must refuse with a 4xx."""
    deep = 100_000
    cases = [
        ("invalid utf-8", b'{"messages": "\xff\xfe\xfa"}', {}),
        ("lone surrogate escape", b'{"session": "\\ud800", "messages": [{"role": "user", "content": "\\udfff"}]}', {}),
        ("latin-1 bytes", '{"session": "café"}'.encode("latin-1"), {}),
        ("utf-16 with BOM", '{"session": "x"}'.encode("utf-16"), {}),
        ("utf-8 BOM", b'\xef\xbb\xbf{"session": "x"}', {}),
        ("NUL bytes", b'{"session": "a\x00b"}', {}),
        ("deep arrays", b"[" * deep + b"]" * deep, {}),
        ("deep objects", b'{"a":' * deep + b"1" + b"}" * deep, {}),
        ("deep in a field", b'{"messages": ' + b"[" * deep + b"]" * deep + b"}", {}),
        ("huge integer", b'{"max_tokens": ' + b"9" * 5000 + b"}", {}),
        ("huge integer 2", b'{"turn_number": ' + b"9" * 200 + b', "conversation_id": "x"}', {}),
        ("huge float", b'{"temperature": 1e999999}', {}),
        # A body a route may accept carries both length caps (`max_tokens`, Ollama's `options.num_predict`):
        # uncapped, a route that ignores the garbage field generated up to the context (1,645 tokens, seconds).
        (
            "huge option",
            b'{"options": {"temperature": 1e999999, "num_predict": 2}, "max_tokens": 2, '
            b'"prompt": "x", "stream": false}',
            {},
        ),
        (
            "NaN option",
            (
                b'{"options": {"repeat_penalty": NaN, "num_predict": 2}, "max_tokens": 2,'
                b' "messages": [{"role": "user", "content": "x"}]}'
            ),
            {},
        ),
        (
            "denormal penalty",
            b'{"repeat_penalty": 5e-324, "max_tokens": 2, "options": {"num_predict": 2}, '
            b'"prompt": "x", "messages": []}',
            {},
        ),
        (
            "logit_bias garbage",
            b'{"logit_bias": {"-1": NaN, "x": 1e400}, "max_tokens": 2, "options": {"num_predict": 2}, "prompt": "x"}',
            {},
        ),
        (
            "NaN",
            (
                b'{"temperature": NaN, "max_tokens": 2, "options": {"num_predict": 2},'
                b' "messages": [{"role": "user", "content": "x"}]}'
            ),
            {},
        ),
        ("Infinity", b'{"top_p": Infinity}', {}),
        ("-0 and exponents", b'{"max_tokens": -0e-0, "seed": 1E400}', {}),
        ("duplicate keys", b'{"session": "a", "session": "b", "snapshot_id": 1, "snapshot_id": "x"}', {}),
        ("truncated JSON", b'{"messages": [{"role": "user", "content": "x"', {}),
        ("trailing garbage", b'{"session": "x"} trailing', {}),
        ("just a number", b"12345678901234567890", {}),
        ("null", b"null", {}),
        ("empty", b"", {}),
        ("whitespace", b" \n\t ", {}),
        ("random bytes", bytes(range(256)) * 8, {}),
        ("wrong types everywhere", json.dumps({k: [[{}]] for k in _ALL_FIELDS}).encode(), {}),
        ("long strings", json.dumps({k: "x" * 100_000 for k in _ALL_FIELDS}).encode(), {}),
        ("many keys", json.dumps({f"k{i}": i for i in range(200_000)}).encode(), {}),
        ("content-type xml", b"<a>1</a>", {"content-type": "application/xml"}),
        ("content-type multipart", b"--x\r\n\r\n--x--", {"content-type": "multipart/form-data; boundary=x"}),
        ("content-type image", b"\x89PNG\r\n", {"content-type": "image/png"}),
        ("content-type garbage", b"{}", {"content-type": "\x01\x02;;;=="}),
        ("charset utf-16 claimed", b'{"session": "x"}', {"content-type": "application/json; charset=utf-16"}),
        ("form body", b"session=x&label=y", {"content-type": "application/x-www-form-urlencoded"}),
        ("gzip claimed", b"not gzip", {"content-encoding": "gzip"}),
        ("8 MiB + 1 body", b'{"x": "' + b"a" * (8 * MiB) + b'"}', {}),
        ("8 MiB of nesting-ish", b"[" * (8 * MiB + 16), {}),
        ("16 MiB body", b"x" * (16 * MiB), {}),
    ]
    return cases


_ALL_FIELDS = [
    "model",
    "messages",
    "session",
    "conversation_id",
    "rid",
    "snapshot_id",
    "label",
    "pin",
    "turn_number",
    "branch_name",
    "continuation",
    "continuation_ids",
    "max_new_tokens",
    "create_new_request",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "n",
    "source",
    "new_session",
    "force",
    "tool",
    "arguments",
    "prompt",
    "suffix",
    "echo",
    "best_of",
    "logprobs",
    "top_logprobs",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "options",
    "format",
    "response_format",
    "context",
    "raw",
    "system",
    "template",
    "keep_alive",
    "images",
]


def garbage_requests(url: str, token: str, findings: Findings, rounds: int = 1) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=auth, timeout=120) as client:
        for _ in range(rounds):
            for name, body, headers in garbage_bodies():
                for path in POST_ROUTES:
                    _send(client, findings, "garbage", "POST", path, name, content=body, headers=headers)
            for path in POST_ROUTES[:4]:
                # a Content-Length that lies (more than sent, or not a number), and a chunked 9 MiB body
                for name, headers in (
                    ("content-length not a number", {"content-length": "12abc"}),
                    ("content-length negative", {"content-length": "-5"}),
                    ("content-length 2^64", {"content-length": str(2**64)}),
                ):
                    _raw(url, token, findings, path, name, headers)
                _send(client, findings, "garbage", "POST", path, "chunked 9 MiB", content=_chunks(9), headers={})
            for method in ("PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "GET"):
                _send(client, findings, "garbage", method, "/save_snapshot", "wrong method", content=b"{}", headers={})
            for q in ("session=%ff%fe", "session=" + "a" * 10_000, "include_chat=maybe", "session=..%2F..%2Fetc"):
                _send(client, findings, "garbage", "GET", f"/list_snapshots?{q}", "bad query", headers={})
                _send(client, findings, "garbage", "GET", f"/v1/agent/tools?{q}", "bad query", headers={})
            for name in ("..", "%2e%2e", "a%00b", "%ff", "x" * 300, "a/b", "%2F"):
                for method, path in (
                    ("GET", "/v1/sessions/{}"),
                    ("DELETE", "/v1/sessions/{}"),
                    ("GET", "/v1/models/{}"),
                ):
                    _send(client, findings, "garbage", method, path.format(name), "bad path", headers={})


def _chunks(mib: int):
    yield b'{"x": "'
    for _ in range(mib):
        yield b"a" * MiB
    yield b'"}'


def _send(client: httpx.Client, findings: Findings, source: str, method: str, path: str, name: str, **kw) -> None:
    t0 = time.perf_counter()
    try:
        r = client.request(method, path, **kw)
    except httpx.HTTPError as e:
        # the daemon may close the connection on a body it refused mid-upload; that is not a 5xx
        findings.cases += 1
        findings.by_source[source] += 1
        findings.by_status["closed"] += 1
        if not isinstance(e, (httpx.RemoteProtocolError, httpx.WriteError, httpx.ReadError)):
            findings.problems.append(f"{method} {path} ({name}): {type(e).__name__}: {e}")
        return
    findings.http(source, f"{method} {path} ({name})", r.status_code, r.headers, r.content, time.perf_counter() - t0)


def _raw(url: str, token: str, findings: Findings, path: str, name: str, headers: dict[str, str]) -> None:
    """A request httpx would not send (a lying Content-Length), over a plain socket."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(url)
    lines = [f"POST {path} HTTP/1.1", f"Host: {u.hostname}", f"Authorization: Bearer {token}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    raw = ("\r\n".join(lines) + "\r\n\r\n{}").encode()
    t0 = time.perf_counter()
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                data = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not data:
                break
            chunks.append(data)
    reply = b"".join(chunks)
    findings.cases += 1
    findings.by_source["garbage"] += 1
    if not reply:
        findings.by_status["closed"] += 1
        return
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    hdrs = {}
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.decode("latin-1").partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if hdrs.get("transfer-encoding") == "chunked":
        body = _dechunk(body)
    refused = refused_before_app(status, body)
    findings.by_status[refused or status] += 1
    if refused:
        return
    problem = error_shape_problem(f"POST {path} ({name})", status, hdrs.get("content-type", ""), body)
    if problem:
        findings.problems.append(problem)
    if time.perf_counter() - t0 > findings.slowest_s:
        findings.slowest_s, findings.slowest = time.perf_counter() - t0, f"POST {path} ({name})"


def _dechunk(body: bytes) -> bytes:
    out, rest = b"", body
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out, rest = out + rest[:n], rest[n + 2 :]
    return out


# -- damaged snapshot files through POST /import_snapshot --------------------------------------------------------
def import_cases(url: str, token: str, findings: Findings, base: bytes, n: int, seed: int = 0) -> collections.Counter:
    """`n` damaged variants of a real export file, imported under fresh session names: each a 4xx ErrorBody
    (or, for a change that means nothing, a 200 that adds a session). Returns status counts by damage kind."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    from tests import snapshot_mutations as mut

    outcomes: collections.Counter = collections.Counter()
    counter = iter(range(10**9))
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
    with httpx.Client(base_url=url, headers=auth, timeout=120) as client:

        def one(case) -> None:
            kind, buf = case
            name = f"imp-{seed}-{next(counter)}"
            t0 = time.perf_counter()
            r = client.post(f"/import_snapshot?session={name}", content=buf)
            findings.http(
                "import",
                f"POST /import_snapshot ({kind})",
                r.status_code,
                r.headers,
                r.content,
                time.perf_counter() - t0,
            )
            outcomes[(kind.split(":")[0], r.status_code)] += 1
            if r.status_code == 200 and kind.startswith(("state:", "foreign", "random", "truncated")):
                findings.problems.append(f"import of a {kind} file was accepted")

        settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))(
            hseed(seed)(given(mut.damaged(base))(one))
        )()
    return outcomes


# -- the WebSocket ----------------------------------------------------------------------------------------------
def ws_frames() -> list[tuple[str, Any]]:
    """(name, frame): str = a text frame, bytes = a binary frame. Each must get an `error` event (or its
    normal answer), and the connection must stay up."""
    deep = 100_000
    text = [
        ("not json", "{nope"),
        ("empty", ""),
        ("a list", "[1, 2]"),
        ("a string", '"chat"'),
        ("null", "null"),
        ("deep arrays", "[" * deep + "]" * deep),
        ("deep objects", '{"a":' * deep + "1" + "}" * deep),
        ("huge integer", '{"type": "ping", "id": ' + "9" * 5000 + "}"),
        ("huge float", '{"type": "ping", "id": 1e999999}'),
        ("NaN id", '{"type": "ping", "id": NaN}'),
        ("no type", '{"id": 1}'),
        ("unknown type", '{"type": "launch"}'),
        ("type not a string", '{"type": ["chat"]}'),
        ("id an object", '{"type": "ping", "id": {"a": 1}}'),
        ("id a bool", '{"type": "ping", "id": true}'),
        ("second auth", '{"type": "auth", "token": "x"}'),
        ("chat without content", '{"type": "chat"}'),
        ("chat both", '{"type": "chat", "content": "x", "messages": []}'),
        ("chat content a number", '{"type": "chat", "content": 5}'),
        ("chat empty messages", '{"type": "chat", "messages": []}'),
        ("chat bad role", '{"type": "chat", "messages": [{"role": "wizard", "content": "x"}]}'),
        ("chat message a list", '{"type": "chat", "messages": [[1]]}'),
        ("chat image part", '{"type": "chat", "messages": [{"role": "user", "content": [{"type": "image"}]}]}'),
        ("chat bad temperature", '{"type": "chat", "content": "x", "temperature": "hot"}'),
        ("chat huge max_tokens", '{"type": "chat", "content": "x", "max_tokens": 99999999}'),
        ("chat unknown field", '{"type": "chat", "content": "x", "bogus": 1}'),
        ("call no tool", '{"type": "call"}'),
        ("call unknown tool", '{"type": "call", "tool": "rm -rf"}'),
        ("call tool a list", '{"type": "call", "tool": ["branch"]}'),
        ("call bad arguments", '{"type": "call", "tool": "branch", "arguments": "not json {"}'),
        ("call arguments a list", '{"type": "call", "tool": "checkpoint", "arguments": [1]}'),
        ("call path-like session", '{"type": "call", "tool": "session_info", "arguments": {"session": "../../etc"}}'),
        ("call unknown field", '{"type": "call", "tool": "checkpoint", "x": 1}'),
        ("cancel nothing", '{"type": "cancel"}'),
        ("lone surrogate", '{"type": "chat", "content": "\\ud800"}'),
        ("2 MiB text", '{"type": "ping", "pad": "' + "x" * (2 * MiB) + '"}'),
    ]
    binary = [
        ("binary not utf-8", b"\xff\xfe\xfd"),
        ("binary json", b'{"type": "ping"}'),
        ("binary empty", b""),
        ("binary random", bytes(range(256))),
    ]
    return text + binary


def ws_cases(url: str, token: str, findings: Findings, rounds: int = 1) -> None:
    """Every malformed frame on one connection (header auth), a ping after each: the connection must answer
    `error` (or its normal event) and then `pong`. Then the first-message auth with garbage: closed 1008."""
    from websockets.sync.client import connect

    ws_url = url.replace("http://", "ws://") + "/v1/agent/ws?session=fuzz-ws"
    with connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=None) as ws:
        ready = json.loads(ws.recv(timeout=30))
        if ready.get("type") != "ready":
            findings.ws("connect", f"first event {ready}")
        for r in range(rounds):
            for name, frame in ws_frames():
                ws.send(frame)
                findings.ws(f"ws {name}", _ws_answer(ws, name))
    # first-message auth, garbage instead: every one is refused (1008), none crashes the daemon
    for name, frame in [
        ("no auth", '{"type": "chat", "content": "x"}'),
        ("bad token", '{"type": "auth", "token": 5}'),
    ] + [(f"auth {n}", f) for n, f in ws_frames()[:10]]:
        with connect(ws_url.split("?")[0], max_size=None) as ws:
            ws.send(frame)
            try:
                event = json.loads(ws.recv(timeout=15))
                problem = None if event.get("type") == "error" else f"answered {event} to an unauthenticated frame"
                ws.recv(timeout=15)
                problem = problem or "the connection stayed open after a refused auth"
            except Exception as e:  # noqa: BLE001 - ConnectionClosed is the expected end
                problem = None if type(e).__name__.startswith("ConnectionClosed") else f"{type(e).__name__}: {e}"
            findings.ws(f"ws auth: {name}", problem)


def _ws_answer(ws, name: str) -> str | None:
    """Read until the ping's pong: every event before it must be an error, a result, token/done or cancelled."""
    ws.send(json.dumps({"type": "ping", "id": "after"}))
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        try:
            event = json.loads(ws.recv(timeout=60))
        except Exception as e:  # noqa: BLE001
            return f"connection lost after {name!r}: {type(e).__name__}: {e}"
        seen.append(event.get("type"))
        if event.get("type") == "error":
            err = event.get("error") or {}
            if not isinstance(err.get("message"), str) or not err["message"].strip() or "code" not in err:
                return f"error event without message/code: {event}"
        elif event.get("type") == "pong" and event.get("id") == "after":
            return None
        elif event.get("type") not in ("token", "done", "result", "cancelled", "pong"):
            return f"unexpected event {event}"
    return f"no pong within 60 s (saw {seen})"


# -- what is stored, before and after ------------------------------------------------------------------------------
@dataclass
class Stored:
    """The snapshots a daemon lists, with their checksums, and their files verified."""

    snapshots: dict[str, str]  # id -> checksum
    transcripts: dict[str, list]

    @classmethod
    def read(cls, url: str, token: str, data_dir: Path, sessions: list[str]) -> "Stored":
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
            snaps = c.post("/list_snapshots", json={}).json()["snapshots"]
            transcripts = {s: c.get(f"/v1/sessions/{s}").json().get("messages") for s in sessions}
        return cls({s["snapshot_id"]: s["checksum"] for s in snaps}, transcripts)

    def verify(self, data_dir: Path) -> list[str]:
        """Each listed snapshot's file decodes (checksum, format) and carries the checksum the index lists."""
        bad = []
        for sid, checksum in self.snapshots.items():
            path = data_dir / "snapshots" / f"{sid}.safetensors"
            try:
                buf = path.read_bytes()
                snapshot_file.decode(buf, source=f"snapshot {sid}")
                (n,) = struct.unpack("<Q", buf[:8])
                recorded = json.loads(buf[8 : 8 + n])["__metadata__"]["checksum"]
            except Exception as e:  # noqa: BLE001 - any failure is a finding
                bad.append(f"{sid}: {type(e).__name__}: {e}")
                continue
            if checksum is not None and recorded != checksum:
                bad.append(f"{sid}: file checksum {recorded} != listed {checksum}")
        return bad
