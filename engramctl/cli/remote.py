"""The CLI over the running daemon (engramctl.client): a catalog for `snapshots`/`ps`/`tiers` while the
daemon holds the store, and the chat link. What the daemon answers is read once, as protocol objects
(engramctl.protocol); the CLI's rows of them are rows.py's. No torch here: with a daemon, `snapshots ls`
stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from engramctl.cli.rows import session_rows, snapshot_rows
from engramctl.errors import EngramError, ModelNotFound, NotFound
from engramctl.protocol import Restored, Session, Snapshot


def snapshot_path(settings: Any, sid: str) -> Path:
    from engramctl.store.names import snapshot_filename

    return settings.paths.data_dir / "snapshots" / snapshot_filename(sid)  # layout of store/files.py


class DaemonCatalog:
    via = "daemon"

    def __init__(self, client: Any, settings: Any):
        self.client, self.settings = client, settings

    @classmethod
    def connect(cls, settings: Any) -> "DaemonCatalog":
        from engramctl.client import Client

        return cls(Client(settings, autostart=False), settings)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "DaemonCatalog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reads ---------------------------------------------------------------------------------------
    def _sessions(self) -> tuple[list[Session], set[str]]:
        """The sessions, and the names of those whose state the daemon holds in memory."""
        listed = self.client.sessions()
        return [Session.from_json(s) for s in listed], {s["name"] for s in listed if s.get("hot")}

    def _snapshots(self, session: str | None = None) -> list[Snapshot]:
        return [Snapshot.from_json(x) for x in self.client.list_snapshots(session)]

    def sessions(self) -> list[dict]:
        sessions, hot = self._sessions()
        return session_rows(sessions, self._snapshots(), hot)

    def snapshots(self, session: str | None = None) -> list[dict]:
        if session is not None:
            self.client.session(session)  # NotFound for an unknown session, like the store
        return snapshot_rows(self._snapshots(session), self._sessions()[0])

    def snapshot(self, sid: str) -> dict:
        d = snapshot_rows([Snapshot.from_json(self.client.snapshot_info(sid))], self._sessions()[0])[0]
        d["path"] = str(self.snapshot_path(d["id"]))
        return d

    def snapshot_ids(self) -> list[str]:
        return [s.id for s in self._snapshots()]

    def session_names(self) -> list[str]:
        return [s.name for s in self._sessions()[0]]

    def resolve(self, ref: str) -> str:
        """The daemon resolves it, by the store's rule (store.names.parse_id_ref / one_id)."""
        return Snapshot.from_json(self.client.snapshot_info(ref)).id

    def transcript(self, session: str) -> list[dict]:
        return list(self.client.session(session).get("messages") or [])

    def snapshot_transcript(self, sid: str) -> list[dict]:
        """The transcript exactly as it was when `sid` was taken."""
        return list(self.client.snapshot_transcript(sid).get("messages") or [])

    def tiers(self) -> dict:
        return self.client.tiers()

    def snapshot_path(self, sid: str) -> Path:
        return snapshot_path(self.settings, sid)

    # -- changes -------------------------------------------------------------------------------------
    def delete(self, ids: list[str], force: bool = False) -> dict:
        freed, deleted = 0, []
        for sid in ids:
            snap = self.snapshot(sid)
            self.client.delete_snapshot(sid, force=force)
            freed += snap["nbytes"] if snap["durable"] else 0
            deleted.append(sid)
        return {"deleted": deleted, "freed_bytes": freed}

    def delete_session(self, name: str) -> dict:
        sizes = {s["id"]: (s["nbytes"] if s["durable"] else 0) for s in self.snapshots(name)}
        res = self.client.delete_session(name)
        deleted = list(res.get("deleted_snapshots") or [])
        return {"session": name, "deleted": deleted, "freed_bytes": sum(sizes.get(i, 0) for i in deleted)}

    def branch(self, source: str, new_session: str) -> dict:
        return Session.from_json(self.client.branch_snapshot(source, new_session)).to_json()

    def pin(self, sid: str, label: str | None = None) -> dict:
        return Snapshot.from_json(self.client.pin_snapshot(sid, label=label)).to_dict()

    def unpin(self, sid: str) -> dict:
        return Snapshot.from_json(self.client.unpin_snapshot(sid)).to_dict()

    def gc(self) -> dict:
        res = self.client.gc_snapshots()
        return {k: res.get(k) for k in ("deleted", "freed_bytes", "messages_removed")}

    def import_file(self, file: Path, session: str | None, label: str | None) -> dict:
        """The daemon verifies the file (checksum, format, and the model it belongs to) and stores it."""
        res = self.client.import_snapshot(file.read_bytes(), session=session, label=label)
        return {**Snapshot.from_json(res).to_dict(), "messages": res.get("messages")}


# -- chat ---------------------------------------------------------------------------------------------
class DaemonChatLink:
    """chat.ChatLink over the client."""

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


def same_model(served: str | None, requested: str | None) -> bool:
    if not requested or not served or requested == "default" or served == requested:
        return True
    try:
        p = Path(requested).expanduser()
        if p.exists():
            return p.resolve() == Path(served).resolve() or p.name == Path(served).name
    except OSError:
        pass
    return Path(requested).name == Path(served).name


def connect_chat(settings: Any, out: Any, requested_model: str | None) -> DaemonChatLink:
    """A chat link to the daemon, starting it first (with the requested model) when it is not running
    and autostart is allowed. A daemon serving another model is an error that says how to switch."""
    from engramctl.client import Client
    from engramctl.daemon.runner import daemon_status, start_background

    info = daemon_status(settings)
    if info is None and not settings.no_autostart:
        what = requested_model or "the default model"
        with out.spinner(f"starting the daemon (loading {what})"):
            info = start_background(settings, wait=True)
        for notice in (info or {}).get("notices") or ():  # e.g. the SmolLM2 fallback, worded by the daemon
            out.note(notice)
    elif info is not None and not info.get("ready"):
        with out.spinner("waiting for the daemon to load its model"):
            info = start_background(settings, wait=True)  # waits for the running one; starts nothing
    client = Client(settings)
    if info is None:  # no autostart: the first request raises DaemonUnreachable with the hint
        client.health()
        info = {}
    served = info.get("model")
    if requested_model and not same_model(served, requested_model):
        client.close()
        raise ModelNotFound(
            f"the running daemon serves {served}, not {requested_model}.",
            hint=f"switch with: engramctl daemon stop && engramctl chat --model {requested_model} "
            "(or chat with the loaded model: leave out --model)",
        )
    if not served:
        try:
            served = client.models()[0]["id"]
        except (EngramError, IndexError, KeyError):
            served = "?"
    return DaemonChatLink(client, served, requested_model)
