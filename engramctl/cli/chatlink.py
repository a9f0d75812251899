"""`engramctl chat`'s link to the daemon: conversation.ChatLink over the client (engramctl.client). What the
daemon answers is read once, as protocol objects (engramctl.protocol). No torch here."""

from __future__ import annotations

from typing import Any, Iterator

from engramctl.errors import EngramError, NotFound
from engramctl.protocol import Restored, Snapshot


class DaemonChatLink:
    """conversation.ChatLink over the client."""

    def __init__(self, client: Any, model_id: str, requested_model: str | None):
        self.client = client
        self.model_id = model_id
        self.model = "default"  # the daemon checked the model at connect time

    def close(self) -> None:
        self.client.close()

    def open_session(self, session: str) -> dict | None:
        try:
            r = Restored.from_json(self.client.restore_snapshot(session=session))
        except NotFound:
            return None
        return {
            "session": session,
            "resumed": bool(r.tokens),
            "restored_tokens": r.tokens,
            "tier": r.tier,
            "restore_ms": r.restore_ms,
            "snapshot_id": r.snapshot_id,
            "n_messages": r.n_messages,
        }

    def stream(self, session: str, messages: list[dict], sampling: dict) -> Iterator[dict]:
        s = self.client.chat_stream(messages, session=session, model=self.model, **sampling)
        started = False
        try:
            for piece in s:
                if not started:
                    started = True
                    yield {"type": "start", "engram": s.turn.to_json()}
                yield {"type": "token", "text": piece}
            if not started:
                yield {"type": "start", "engram": s.turn.to_json()}
            # the stream has ended at [DONE]: past the finish chunk, the trailing one brought the recorded
            # turn's engram (its snapshot id, which the chat shows and /save, /branch use)
            yield {"type": "done", "finish_reason": s.finish_reason, "usage": s.usage, "engram": s.turn.to_json()}
        finally:
            s.close()  # an early exit (Ctrl-C) disconnects: the daemon cancels and records the partial reply

    def settle(self, timeout: float = 5.0) -> None:
        """After an interrupted reply: wait until the daemon has cancelled the generation and recorded
        the partial reply, so what the user does next (/history, the next turn) sees it."""
        import time

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                queue = self.client.status().get("queue") or {}
            except EngramError:
                return
            if not queue.get("busy") and not queue.get("waiting"):
                return
            time.sleep(0.05)

    def head(self, session: str) -> dict | None:
        """The snapshot the session continues from now (None: none yet)."""
        try:
            return Snapshot.from_json(self.client.snapshot_info(session=session)).to_dict()
        except NotFound:
            return None

    def save(self, session: str, label: str | None) -> dict:
        return Snapshot.from_json(self.client.save_snapshot(session, label=label, pin=True)).to_dict()

    def branch(self, session: str, new_session: str) -> dict:
        return self.client.branch_snapshot(session, new_session)

    def transcript(self, session: str) -> list[dict]:
        try:
            return list(self.client.session(session).get("messages") or [])
        except NotFound:
            return []

    def reset(self, session: str) -> dict | None:
        """Start the session over; its snapshots are kept. None when there is no such session."""
        try:
            res = self.client.reset_session(session)
        except NotFound:
            return None
        return {
            "session": session,
            "kept_snapshots": res.get("n_snapshots") or 0,
            "previous_head": res.get("previous_head"),
        }

    def snapshot(self, snapshot_id: str) -> dict:
        return Snapshot.from_json(self.client.snapshot_info(snapshot_id)).to_dict()


def connect_chat(settings: Any, out: Any, requested_model: str | None) -> DaemonChatLink:
    """A chat link to the daemon (connect.py: started first, with the requested model, when none runs and
    autostart is allowed). A daemon serving another model is an error that says how to switch."""
    from engramctl.cli.connect import connect

    client, info = connect(settings, out, model=requested_model)
    served = info.get("model")
    if not served:
        try:
            served = client.models()[0]["id"]
        except (EngramError, IndexError, KeyError):
            served = "?"
    return DaemonChatLink(client, served, requested_model)
