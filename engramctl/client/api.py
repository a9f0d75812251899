"""Client: one method per daemon route, over a Connection (connection.py: where, token, autostart, errors).

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

from typing import Any, Sequence

from engramctl.client.connection import Connection
from engramctl.client.stream import ChatStream
from engramctl.engine.sampling_params import OPTIONS as SAMPLING_OPTIONS
from engramctl.settings import Settings
from engramctl.store.names import validate_session_name

_SAMPLING = tuple(SAMPLING_OPTIONS)  # defined once: engine/sampling_params.py


class Client:
    def __init__(self, settings: Settings | None = None, **connection: Any):
        """`connection`: Connection's options (base_url, token, autostart, timeout, transport), which say
        where the daemon is and whether to start it."""
        self.connection = Connection(settings, **connection)
        self.settings = self.connection.settings

    def _stream(self, path: str, body: dict) -> ChatStream:
        cm, response = self.connection.open_stream(path, body)
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            try:  # a job that generated nothing answers with plain JSON
                response.read()
                stream = ChatStream(None, response)
                stream.engram = response.json()
                stream.done = True
                return stream
            finally:
                cm.__exit__(None, None, None)
        return ChatStream(cm, response, self.connection.broken)

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- daemon --------------------------------------------------------------------------------------
    def health(self) -> dict:
        """GET /health (no token needed): {status, model, version}."""
        return self.connection.request("GET", "/health", auth=False)

    def status(self) -> dict:
        """GET /v1/status: model, device, dtype, rss_bytes, uptime_s, sessions, hot, queue, ..."""
        return self.connection.request("GET", "/v1/status")

    def tiers(self) -> dict:
        """GET /v1/tiers: the tier plan (hardware, budgets, rules, usage)."""
        return self.connection.request("GET", "/v1/tiers")

    def models(self) -> list[dict]:
        """GET /v1/models: the loaded model (one entry)."""
        return self.connection.request("GET", "/v1/models")["data"]

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
        return self.connection.request(
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
        return self.connection.request(
            "POST", "/save_snapshot", {"session": session, "label": label, "pin": pin}, long=True
        )

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
        return self.connection.request("POST", "/restore_snapshot", body, long=True)

    def list_snapshots(self, session: str | None = None) -> list[dict]:
        """POST /list_snapshots: all snapshots, or one session's, oldest first."""
        body = {} if session is None else {"session": session}
        return self.connection.request("POST", "/list_snapshots", body)["snapshots"]

    def snapshot_info(self, snapshot_id: str | None = None, *, session: str | None = None) -> dict:
        """POST /get_snapshot_info: one snapshot (id or unique id prefix), or a session's head."""
        return self.connection.request("POST", "/get_snapshot_info", {"snapshot_id": snapshot_id, "session": session})

    def delete_snapshot(self, snapshot_id: str, *, force: bool = False) -> dict:
        """POST /delete_snapshot. A session head, branch point or pinned snapshot needs force=True."""
        return self.connection.request("POST", "/delete_snapshot", {"snapshot_id": snapshot_id, "force": force})

    def freed_bytes(self, snapshot_ids: list[str]) -> int:
        """POST /v1/snapshots/freed_bytes: what deleting these snapshots (full ids) together frees on disk."""
        return self.connection.request("POST", "/v1/snapshots/freed_bytes", {"snapshot_ids": snapshot_ids})[
            "freed_bytes"
        ]

    def branch_snapshot(self, source: str, new_session: str) -> dict:
        """POST /branch_snapshot: a new session starting at `source` (a session's head, a snapshot id or
        a unique id prefix). Returns the new session."""
        return self.connection.request("POST", "/branch_snapshot", {"source": source, "new_session": new_session})

    def pin_snapshot(self, snapshot_id: str, *, label: str | None = None) -> dict:
        """POST /pin_snapshot: pin any snapshot (id or unique id prefix), optionally labelling it."""
        return self.connection.request("POST", "/pin_snapshot", {"snapshot_id": snapshot_id, "label": label})

    def unpin_snapshot(self, snapshot_id: str) -> dict:
        """POST /unpin_snapshot: retention may delete it again."""
        return self.connection.request("POST", "/unpin_snapshot", {"snapshot_id": snapshot_id})

    def label_snapshot(self, snapshot_id: str, label: str | None) -> dict:
        """POST /label_snapshot: set a snapshot's label (None clears it)."""
        return self.connection.request("POST", "/label_snapshot", {"snapshot_id": snapshot_id, "label": label})

    def snapshot_transcript(self, snapshot_id: str) -> dict:
        """POST /get_snapshot_transcript: {snapshot_id, session, n_messages, messages}, the transcript
        exactly as it was when the snapshot was taken."""
        return self.connection.request("POST", "/get_snapshot_transcript", {"snapshot_id": snapshot_id})

    def gc_snapshots(self) -> dict:
        """POST /gc_snapshots: apply retention now. Returns {deleted: {id: reason}, freed_bytes,
        messages_removed}."""
        return self.connection.request("POST", "/gc_snapshots", long=True)

    def import_snapshot(self, data: bytes, *, session: str | None = None, label: str | None = None) -> dict:
        """POST /import_snapshot: the bytes of a `snapshots export` file become a new session (default
        name: the one the file records). The daemon verifies it against the loaded model first
        (SnapshotMismatch for another model's snapshot; nothing is stored then). Returns the snapshot."""
        return self.connection.request(
            "POST", "/import_snapshot", content=data, params={"session": session, "label": label}, long=True
        )

    # -- sessions ------------------------------------------------------------------------------------
    def sessions(self) -> list[dict]:
        """GET /v1/sessions."""
        return self.connection.request("GET", "/v1/sessions")["sessions"]

    def session(self, name: str) -> dict:
        """GET /v1/sessions/{name}: the session and its transcript ("messages")."""
        return self.connection.request("GET", f"/v1/sessions/{validate_session_name(name)}")

    def delete_session(self, name: str) -> dict:
        """DELETE /v1/sessions/{name}: the session, its transcript and the snapshots only it uses."""
        return self.connection.request("DELETE", f"/v1/sessions/{validate_session_name(name)}")

    def reset_session(self, name: str) -> dict:
        """POST /v1/sessions/{name}/reset: start the session over (no state, empty transcript); its
        snapshots are kept. Returns the session plus `previous_head`."""
        return self.connection.request("POST", f"/v1/sessions/{validate_session_name(name)}/reset", long=True)

    # -- agent tools (engramctl.agent.tools) -------------------------------------------------------------
    def agent_tools(self, *, include_chat: bool = False) -> dict:
        """GET /v1/agent/tools: {"tools": [OpenAI function tools], "results": {name: result JSON Schema}}."""
        return self.connection.request("GET", "/v1/agent/tools" + ("?include_chat=true" if include_chat else ""))

    def agent_call(self, tool: str, arguments: dict | None = None) -> dict:
        """POST /v1/agent/call: run one agent tool (checkpoint, branch, restore, list_checkpoints,
        delete_checkpoint, session_info, chat). Returns its result; bad arguments raise UsageError naming
        the field."""
        body = {"tool": tool, "arguments": arguments or {}}
        return self.connection.request("POST", "/v1/agent/call", body, long=True)["result"]
