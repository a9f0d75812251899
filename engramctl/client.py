"""The daemon's HTTP client: one method per endpoint, typed errors, autostart.

    with Client(settings) as c:
        r = c.chat([{"role": "user", "content": "hi"}], session="notes")       # OpenAI response + "engram"
        with c.chat_stream(messages, session="notes") as s:
            for piece in s:
                print(piece, end="")
        s.engram, s.usage, s.finish_reason                                     # after the stream

Errors: nothing listening -> DaemonUnreachable (exit code 3), unless autostart (the default when
settings.no_autostart is false and the daemon is this data directory's own) starts it first. A non-2xx
answer raises the EngramError subclass named by its error `code` (NotFound, ContextOverflow,
InvalidName, SnapshotInUse, QueueFull, AuthenticationFailed, ...) with the daemon's message and hint.
Leaving a chat_stream early (break, close(), Ctrl-C) disconnects, which cancels the generation; the
daemon records the partial reply.

torch is never imported here.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator, Sequence

import httpx

from engramctl.engine.sampling_params import OPTIONS as SAMPLING_OPTIONS
from engramctl.errors import (
    AuthenticationFailed,
    DaemonUnreachable,
    EngramError,
    NotFound,
    QueueFull,
    RequestTooLarge,
    ShuttingDown,
    SnapshotError,
    UsageError,
)
from engramctl.protocol import ErrorBody, TurnInfo
from engramctl.settings import Settings, load_settings
from engramctl.store.names import validate_session_name

# An answer whose code names no engramctl error (a proxy's, or a framework's own) by its status.
_BY_STATUS: dict[int, type[EngramError]] = {
    400: UsageError,
    401: AuthenticationFailed,
    404: NotFound,
    409: SnapshotError,
    413: RequestTooLarge,
    422: UsageError,
    429: QueueFull,
    503: ShuttingDown,
}
_SAMPLING = tuple(SAMPLING_OPTIONS)  # defined once: engine/sampling_params.py


def error_from_body(status: int, body: Any) -> EngramError:
    """The typed error for a daemon error answer (protocol.ErrorBody): the class that declared its code
    (engramctl.errors registers each by kind), else one by its status."""
    err = ErrorBody.from_json(body)
    if err is None:
        return EngramError(f"the daemon answered HTTP {status}: {str(body)[:200]}")
    cls = EngramError.for_kind(str(err.code)) or _BY_STATUS.get(status) or EngramError
    return cls.from_wire(err.message or f"HTTP {status}", err.hint, err.param)


def _error_from_response(r: httpx.Response) -> EngramError:
    try:
        body = r.json()
    except ValueError:
        body = r.text
    return error_from_body(r.status_code, body)


class ChatStream:
    """A streamed completion. Iterate for text pieces; afterwards `.text`, `.finish_reason`, `.usage`
    and `.engram` (the first chunk's extension updated by the last one: session, resumed,
    restored_tokens, tier, restore_ms, snapshot_id, ...), read as a protocol.TurnInfo by `.turn`.
    Usable as a context manager."""

    def __init__(self, cm, response: httpx.Response):
        self._cm, self._response = cm, response
        self.engram: dict[str, Any] = {}
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.id: str | None = None
        self.pieces: list[str] = []
        self.done = False

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def turn(self) -> TurnInfo:
        return TurnInfo.from_json(self.engram)

    def __iter__(self) -> Iterator[str]:
        try:
            for line in self._response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    self.done = True
                    break
                obj = json.loads(data)
                if "error" in obj:
                    raise error_from_body(500, obj)
                self.id = obj.get("id", self.id)
                if isinstance(obj.get("engram"), dict):
                    self.engram.update(obj["engram"])
                if obj.get("usage"):
                    self.usage = obj["usage"]
                for choice in obj.get("choices") or ():
                    if choice.get("finish_reason"):
                        self.finish_reason = choice["finish_reason"]
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        self.pieces.append(piece)
                        yield piece
        except httpx.HTTPError as e:
            raise DaemonUnreachable(f"the connection to the daemon broke mid-stream ({e}).") from None
        finally:
            self.close()

    def close(self) -> None:
        """Disconnect (cancels the generation if it is still running)."""
        if self._cm is not None:
            cm, self._cm = self._cm, None
            cm.__exit__(None, None, None)

    def __enter__(self) -> "ChatStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Client:
    def __init__(
        self,
        settings: Settings | None = None,
        *,
        base_url: str | None = None,
        token: str | None = None,
        autostart: bool | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ):
        """base_url: default = the running daemon of settings' data directory, else settings.host:port.
        autostart: default = not settings.no_autostart, and only when base_url is not given."""
        self.settings = settings or load_settings()
        self._base_url = base_url.rstrip("/") if base_url else None
        self._token = token
        self.autostart = (not self.settings.no_autostart) if autostart is None else autostart
        self._autostarted = False
        self._http = httpx.Client(timeout=httpx.Timeout(timeout, connect=5.0), transport=transport)

    # -- plumbing ------------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        if self._base_url:
            return self._base_url
        from engramctl.daemon.runner import daemon_url

        return daemon_url(self.settings)

    def _headers(self) -> dict[str, str]:
        token = self._token
        if token is None:
            from engramctl.daemon.auth import read_token

            token = read_token(self.settings)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _can_autostart(self) -> bool:
        if not self.autostart or self._autostarted or self._base_url:
            return False
        from engramctl.daemon.runner import is_loopback

        return is_loopback(self.settings.host)

    def _unreachable(self, url: str, e: Exception) -> DaemonUnreachable:
        hint = "start it with `engramctl daemon start` (or `engramctl serve`)"
        if self.settings.no_autostart and not self._base_url:
            hint += "; ENGRAM_NO_AUTOSTART is set, so commands do not start it themselves"
        return DaemonUnreachable(f"no engramctl daemon answers at {url} ({type(e).__name__}).", hint=hint)

    def _autostart(self) -> None:
        from engramctl.daemon.runner import start_background

        self._autostarted = True
        start_background(self.settings, wait=True)

    def _send(self, path: str, open_response: Callable[[str], Any]) -> Any:
        """`open_response(url)`, starting the daemon once and retrying when nothing listens there.
        Headers are built inside `open_response`: an autostarted daemon may have just written the token."""
        while True:
            url = self.base_url + path
            try:
                return open_response(url)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                if self._can_autostart():
                    self._autostart()
                    continue
                raise self._unreachable(url, e) from None
            except httpx.HTTPError as e:
                raise DaemonUnreachable(f"the request to {url} failed: {e}.") from None

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        long: bool = False,
        auth: bool = True,
        content: bytes | None = None,
        params: dict | None = None,
    ) -> Any:
        """JSON `body`, or raw `content` (sent as application/octet-stream); `params` go in the query."""
        timeout = httpx.Timeout(self._http.timeout.write, connect=5.0, read=None) if long else None

        def send(url: str) -> httpx.Response:
            kwargs: dict[str, Any] = {"headers": self._headers() if auth else {}}
            if body is not None:
                kwargs["json"] = body
            if content is not None:
                kwargs["content"] = content
                kwargs["headers"]["Content-Type"] = "application/octet-stream"
            if params:
                kwargs["params"] = {k: v for k, v in params.items() if v is not None}
            if timeout is not None:
                kwargs["timeout"] = timeout
            return self._http.request(method, url, **kwargs)

        r = self._send(path, send)
        if r.status_code >= 400:
            raise _error_from_response(r)
        return r.json()

    def _stream(self, path: str, body: dict) -> ChatStream:
        timeout = httpx.Timeout(self._http.timeout.write, connect=5.0, read=None)

        def open_stream(url: str):
            cm = self._http.stream("POST", url, json=body, headers=self._headers(), timeout=timeout)
            return cm, cm.__enter__()

        cm, response = self._send(path, open_stream)
        if response.status_code >= 400:
            try:
                response.read()
                raise _error_from_response(response)
            finally:
                cm.__exit__(None, None, None)
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            try:  # a job that generated nothing answers with plain JSON
                response.read()
                stream = ChatStream(None, response)
                stream.engram = response.json()
                stream.done = True
                return stream
            finally:
                cm.__exit__(None, None, None)
        return ChatStream(cm, response)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- daemon --------------------------------------------------------------------------------------
    def health(self) -> dict:
        """GET /health (no token needed): {status, model, version}."""
        return self._request("GET", "/health", auth=False)

    def status(self) -> dict:
        """GET /v1/status: model, device, dtype, rss_bytes, uptime_s, sessions, hot, queue, ..."""
        return self._request("GET", "/v1/status")

    def tiers(self) -> dict:
        """GET /v1/tiers: the tier plan (hardware, budgets, rules, usage)."""
        return self._request("GET", "/v1/tiers")

    def models(self) -> list[dict]:
        """GET /v1/models: the loaded model (one entry)."""
        return self._request("GET", "/v1/models")["data"]

    # -- chat ----------------------------------------------------------------------------------------
    @staticmethod
    def _chat_body(messages: Sequence[dict], model: str, session: str | None, sampling: dict) -> dict:
        body: dict[str, Any] = {"model": model, "messages": list(messages)}
        if session is not None:
            body["session"] = session
        for key, value in sampling.items():
            if key not in _SAMPLING:
                raise TypeError(f"unknown sampling option {key!r}")
            if value is not None:
                body[key] = value
        return body

    def chat(
        self, messages: Sequence[dict], *, session: str | None = None, model: str = "default", **sampling: Any
    ) -> dict:
        """POST /v1/chat/completions (not streamed). sampling: temperature, top_p, top_k, max_tokens,
        stop, seed. Returns the OpenAI response with its "engram" extension."""
        return self._request(
            "POST", "/v1/chat/completions", self._chat_body(messages, model, session, sampling), long=True
        )

    def chat_stream(
        self, messages: Sequence[dict], *, session: str | None = None, model: str = "default", **sampling: Any
    ) -> ChatStream:
        """POST /v1/chat/completions with stream=true (usage included). Raises before returning if the
        daemon refuses the request."""
        body = self._chat_body(messages, model, session, sampling)
        body.update(stream=True, stream_options={"include_usage": True})
        return self._stream("/v1/chat/completions", body)

    # -- snapshots -----------------------------------------------------------------------------------
    def save_snapshot(self, session: str, *, label: str | None = None, pin: bool = True) -> dict:
        """POST /save_snapshot: pin (and label) the session's current state. Returns the snapshot."""
        return self._request("POST", "/save_snapshot", {"session": session, "label": label, "pin": pin}, long=True)

    def restore_snapshot(
        self,
        snapshot_id: str | None = None,
        *,
        session: str | None = None,
        continuation: str | dict | None = None,
        stream: bool = False,
        **sampling: Any,
    ) -> dict | ChatStream:
        """POST /restore_snapshot: make `snapshot_id` (or `session`'s head) the session's state and load
        it into memory; restoring into a new `session` name branches there. Returns {session,
        snapshot_id, tokens, tier, restore_ms}; with a continuation (a user message), the completion
        (a ChatStream when stream=True)."""
        body: dict[str, Any] = {"snapshot_id": snapshot_id, "session": session}
        if continuation is not None:
            body["continuation"] = continuation
            body.update({k: v for k, v in sampling.items() if v is not None})
            if stream:
                body.update(stream=True, stream_options={"include_usage": True})
                return self._stream("/restore_snapshot", body)
        return self._request("POST", "/restore_snapshot", body, long=True)

    def list_snapshots(self, session: str | None = None) -> list[dict]:
        """POST /list_snapshots: all snapshots, or one session's, oldest first."""
        body = {} if session is None else {"session": session}
        return self._request("POST", "/list_snapshots", body)["snapshots"]

    def snapshot_info(self, snapshot_id: str | None = None, *, session: str | None = None) -> dict:
        """POST /get_snapshot_info: one snapshot (id or unique id prefix), or a session's head."""
        return self._request("POST", "/get_snapshot_info", {"snapshot_id": snapshot_id, "session": session})

    def delete_snapshot(self, snapshot_id: str, *, force: bool = False) -> dict:
        """POST /delete_snapshot. A session head, branch point or pinned snapshot needs force=True."""
        return self._request("POST", "/delete_snapshot", {"snapshot_id": snapshot_id, "force": force})

    def branch_snapshot(self, source: str, new_session: str) -> dict:
        """POST /branch_snapshot: a new session starting at `source` (a session's head, a snapshot id or
        a unique id prefix). Returns the new session."""
        return self._request("POST", "/branch_snapshot", {"source": source, "new_session": new_session})

    def pin_snapshot(self, snapshot_id: str, *, label: str | None = None) -> dict:
        """POST /pin_snapshot: pin any snapshot (id or unique id prefix), optionally labelling it."""
        return self._request("POST", "/pin_snapshot", {"snapshot_id": snapshot_id, "label": label})

    def unpin_snapshot(self, snapshot_id: str) -> dict:
        """POST /unpin_snapshot: retention may delete it again."""
        return self._request("POST", "/unpin_snapshot", {"snapshot_id": snapshot_id})

    def label_snapshot(self, snapshot_id: str, label: str | None) -> dict:
        """POST /label_snapshot: set a snapshot's label (None clears it)."""
        return self._request("POST", "/label_snapshot", {"snapshot_id": snapshot_id, "label": label})

    def snapshot_transcript(self, snapshot_id: str) -> dict:
        """POST /get_snapshot_transcript: {snapshot_id, session, n_messages, messages}, the transcript
        exactly as it was when the snapshot was taken."""
        return self._request("POST", "/get_snapshot_transcript", {"snapshot_id": snapshot_id})

    def gc_snapshots(self) -> dict:
        """POST /gc_snapshots: apply retention now. Returns {deleted: {id: reason}, freed_bytes,
        messages_removed}."""
        return self._request("POST", "/gc_snapshots", long=True)

    def import_snapshot(self, data: bytes, *, session: str | None = None, label: str | None = None) -> dict:
        """POST /import_snapshot: the bytes of a `snapshots export` file become a new session (default
        name: the one the file records). The daemon verifies it against the loaded model first
        (SnapshotMismatch for another model's snapshot; nothing is stored then). Returns the snapshot."""
        return self._request(
            "POST", "/import_snapshot", content=data, params={"session": session, "label": label}, long=True
        )

    # -- sessions ------------------------------------------------------------------------------------
    def sessions(self) -> list[dict]:
        """GET /v1/sessions."""
        return self._request("GET", "/v1/sessions")["sessions"]

    def session(self, name: str) -> dict:
        """GET /v1/sessions/{name}: the session and its transcript ("messages")."""
        return self._request("GET", f"/v1/sessions/{validate_session_name(name)}")

    def delete_session(self, name: str) -> dict:
        """DELETE /v1/sessions/{name}: the session, its transcript and the snapshots only it uses."""
        return self._request("DELETE", f"/v1/sessions/{validate_session_name(name)}")

    def reset_session(self, name: str) -> dict:
        """POST /v1/sessions/{name}/reset: start the session over (no state, empty transcript); its
        snapshots are kept. Returns the session plus `previous_head`."""
        return self._request("POST", f"/v1/sessions/{validate_session_name(name)}/reset", long=True)

    # -- agent tools (engramctl.agent.tools) -------------------------------------------------------------
    def agent_tools(self, *, include_chat: bool = False) -> dict:
        """GET /v1/agent/tools: {"tools": [OpenAI function tools], "results": {name: result JSON Schema}}."""
        return self._request("GET", "/v1/agent/tools" + ("?include_chat=true" if include_chat else ""))

    def agent_call(self, tool: str, arguments: dict | None = None) -> dict:
        """POST /v1/agent/call: run one agent tool (checkpoint, branch, restore, list_checkpoints,
        delete_checkpoint, session_info, chat). Returns its result; bad arguments raise UsageError naming
        the field."""
        body = {"tool": tool, "arguments": arguments or {}}
        return self._request("POST", "/v1/agent/call", body, long=True)["result"]
