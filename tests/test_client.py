"""engramctl.client without a daemon: unreachable -> DaemonUnreachable (exit 3), error bodies -> typed
errors, SSE parsing, autostart only when allowed."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from engramctl import client as client_mod
from engramctl.client import ChatStream, Client, error_from_body
from engramctl.daemon.errors import AuthenticationFailed, QueueFull, ShuttingDown
from engramctl.errors import (
    ContextOverflow,
    DaemonUnreachable,
    EngramError,
    InvalidName,
    ModelNotFound,
    NotFound,
    SnapshotMismatch,
)
from engramctl.protocol import ErrorBody
from engramctl.settings import load_settings
from engramctl.errors import SnapshotInUse


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mock(handler) -> Client:
    return Client(load_settings({}), base_url="http://daemon.test", token="t", transport=httpx.MockTransport(handler))


def test_nothing_listening_is_daemon_unreachable(engram_home):
    port = _free_port()
    settings = load_settings({"port": port})
    assert settings.no_autostart  # ENGRAM_NO_AUTOSTART=1 in tests
    for c in (Client(settings), Client(settings, base_url=f"http://127.0.0.1:{port}")):
        with c, pytest.raises(DaemonUnreachable) as e:
            c.health()
        assert e.value.exit_code == 3 and str(port) in e.value.message and "daemon start" in e.value.hint
    with Client(settings) as c, pytest.raises(DaemonUnreachable):
        c.chat_stream([{"role": "user", "content": "x"}])


def _refusal(status: int, code: str, message: str, hint: str | None = None) -> httpx.Response:
    """What the daemon answers when it refuses (daemon/errors.py writes protocol.ErrorBody)."""
    return httpx.Response(status, json=ErrorBody(message, "invalid_request_error", code, hint=hint).to_json())


def test_error_bodies_become_typed_errors():
    def body(status, code, message="m", hint=None):
        return error_from_body(status, ErrorBody(message, "x", code, hint=hint).to_json())

    assert isinstance(body(404, "not_found", "no session 'a'"), NotFound)
    assert body(404, "not_found", "no session 'a'").message == "no session 'a'"
    assert isinstance(body(404, "model_not_found"), ModelNotFound)
    assert isinstance(body(400, "context_length_exceeded"), ContextOverflow)
    assert isinstance(body(400, "invalid_name"), InvalidName)
    assert isinstance(body(409, "snapshot_in_use"), SnapshotInUse)
    assert isinstance(body(429, "queue_full"), QueueFull)
    assert isinstance(body(401, "authentication_error"), AuthenticationFailed)
    assert isinstance(body(503, "whatever"), ShuttingDown)  # unknown code: by status
    assert body(400, "invalid_request", hint="do this").hint == "do this"
    plain = error_from_body(502, "<html>bad gateway</html>")
    assert type(plain) is EngramError and "502" in plain.message


def test_requests_carry_the_token_and_raise_on_errors():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(
            (
                request.method,
                request.url.path,
                request.headers.get("authorization"),
                json.loads(request.content) if request.content else None,
            )
        )
        if request.url.path == "/delete_snapshot":
            return _refusal(409, "snapshot_in_use", "in use", hint="force it")
        if request.url.path == "/list_snapshots":
            return httpx.Response(200, json={"success": True, "snapshots": [{"snapshot_id": "a"}]})
        return httpx.Response(200, json={"ok": True})

    with _mock(handler) as c:
        assert c.list_snapshots("s") == [{"snapshot_id": "a"}]
        with pytest.raises(SnapshotInUse, match="in use") as e:
            c.delete_snapshot("a" * 32)
        assert e.value.hint == "force it"
        c.chat([{"role": "user", "content": "hi"}], session="s", temperature=0, max_tokens=4, stop=None)
        c.branch_snapshot("s", "t")
        with pytest.raises(InvalidName):
            c.session("../etc")
        with pytest.raises(TypeError):
            c.chat([], temprature=1)
    assert seen[0] == ("POST", "/list_snapshots", "Bearer t", {"session": "s"})
    assert seen[2][3] == {
        "model": "default",
        "messages": [{"role": "user", "content": "hi"}],
        "session": "s",
        "temperature": 0,
        "max_tokens": 4,
    }
    assert seen[3][3] == {"source": "s", "new_session": "t"}


def _sse(*objs) -> bytes:
    return b"".join(f"data: {json.dumps(o)}\n\n".encode() for o in objs) + b"data: [DONE]\n\n"


def test_chat_stream_parses_pieces_extension_and_usage():
    def chunk(delta, finish=None, **extra):
        return {
            "id": "c1",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }

    body = _sse(
        chunk({"role": "assistant", "content": ""}, engram={"session": "s", "resumed": True, "snapshot_id": None}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, "stop"),  # the finish, as soon as generation stops; then, once recorded, the engram
        {
            "id": "c1",
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            "engram": {"session": "s", "resumed": True, "snapshot_id": "abc"},
        },
    )

    def handler(request):
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    with _mock(handler) as c:
        with c.chat_stream([{"role": "user", "content": "hi"}], session="s") as s:
            assert isinstance(s, ChatStream)
            assert list(s) == ["Hel", "lo"]
    assert s.text == "Hello" and s.finish_reason == "stop" and s.finished and s.done
    assert s.engram == {"session": "s", "resumed": True, "snapshot_id": "abc"} and s.usage["completion_tokens"] == 2

    def failing(request):
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            content=_sse(chunk({"content": "a"}), {"error": {"message": "boom", "code": "x"}}),
        )

    with _mock(failing) as c, pytest.raises(EngramError, match="boom"):
        list(c.chat_stream([{"role": "user", "content": "hi"}]))

    def refused(request):
        return _refusal(400, "context_length_exceeded", "too long")

    with _mock(refused) as c, pytest.raises(ContextOverflow, match="too long"):
        c.chat_stream([{"role": "user", "content": "hi"}])


def test_autostart_starts_the_daemon_once_when_allowed(engram_home, monkeypatch):
    calls = []
    up = {"flag": False}

    def handler(request):
        if not up["flag"]:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"status": "ok"})

    def fake_start(settings, wait=True, **kw):
        calls.append(wait)
        up["flag"] = True
        return {"ready": True}

    monkeypatch.setattr("engramctl.daemon.background.start_background", fake_start)
    monkeypatch.setattr("engramctl.daemon.rundir.daemon_url", lambda s: "http://127.0.0.1:1")
    allowed = load_settings({"no_autostart": False})
    with Client(allowed, token="t", transport=httpx.MockTransport(handler)) as c:
        assert c.health() == {"status": "ok"}
    assert calls == [True]

    up["flag"] = False
    for c in (
        Client(load_settings({}), token="t", transport=httpx.MockTransport(handler)),  # no_autostart
        Client(allowed, base_url="http://127.0.0.1:1", token="t", transport=httpx.MockTransport(handler)),
    ):
        with c, pytest.raises(DaemonUnreachable):
            c.health()
    assert calls == [True]
    assert client_mod.Client(allowed, autostart=False).connection.autostart is False


def test_management_methods_hit_their_routes():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        ctype = request.headers.get("content-type", "")
        is_json = ctype.startswith("application/json") and request.content
        body = json.loads(request.content) if is_json else request.content
        seen.append((request.url.path, dict(request.url.params), ctype, body))
        if request.url.path == "/import_snapshot":
            return _refusal(409, "snapshot_mismatch", "the snapshot belongs to model 'x'", hint="serve x")
        return httpx.Response(200, json={"success": True})

    with _mock(handler) as c:
        c.pin_snapshot("abcdef12", label="keep")
        c.unpin_snapshot("abcdef12")
        c.label_snapshot("abcdef12", None)
        c.snapshot_transcript("abcdef12")
        c.gc_snapshots()
        c.reset_session("notes")
        with pytest.raises(SnapshotMismatch, match="belongs to model") as e:
            c.import_snapshot(b"\x00file bytes", session="copy")
        assert e.value.hint == "serve x" and e.value.exit_code == 1
        with pytest.raises(InvalidName):
            c.reset_session("../x")
    assert seen[:4] == [
        ("/pin_snapshot", {}, "application/json", {"snapshot_id": "abcdef12", "label": "keep"}),
        ("/unpin_snapshot", {}, "application/json", {"snapshot_id": "abcdef12"}),
        ("/label_snapshot", {}, "application/json", {"snapshot_id": "abcdef12", "label": None}),
        ("/get_snapshot_transcript", {}, "application/json", {"snapshot_id": "abcdef12"}),
    ]
    assert [s[0] for s in seen[4:]] == ["/gc_snapshots", "/v1/sessions/notes/reset", "/import_snapshot"]
    assert seen[-1][1:] == ({"session": "copy"}, "application/octet-stream", b"\x00file bytes")
    assert AuthenticationFailed("x").exit_code == 1  # the documented scheme: 0 ok, 1 error, 2 usage, 3 unreachable
