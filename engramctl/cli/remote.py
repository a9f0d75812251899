"""The CLI over the running daemon (engramctl.client): a catalog for `snapshots`/`ps`/`tiers` while the
daemon holds the store, and the chat link. No torch here: with a daemon, `snapshots ls` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from engramctl.cli.catalog import _annotate, resolve_prefix
from engramctl.errors import EngramError, ModelNotFound, NotFound


def normalize_snapshot(d: dict) -> dict:
    """A snapshot as the daemon's routes show it -> the store's record shape (SnapshotRecord.to_json)."""
    return {
        "id": d.get("snapshot_id") or d.get("id"),
        "session": d.get("session") or d.get("conversation_id"),
        "parent": d.get("parent"),
        "n_tokens": d.get("tokens", d.get("n_tokens")),
        "nbytes": d.get("bytes", d.get("nbytes")),
        "checksum": d.get("checksum"),
        "fingerprint": d.get("fingerprint"),
        "model_id": d.get("model_id"),
        "n_messages": d.get("n_messages"),
        "created": d.get("created"),
        "last_access": d.get("last_access"),
        "pinned": bool(d.get("pinned")),
        "label": d.get("label"),
        "durable": bool(d.get("durable", True)),
        "tiers": list(d.get("tiers") or ([d["tier"]] if d.get("tier") else [])),
    }


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
    def _raw_sessions(self) -> list[dict]:
        return self.client.sessions()

    def sessions(self) -> list[dict]:
        snaps = {s["id"]: s for s in (normalize_snapshot(x) for x in self.client.list_snapshots())}
        out = []
        for s in self._raw_sessions():
            d = {k: v for k, v in s.items() if k != "conversation_id"}
            head = snaps.get(s.get("head") or "")
            d["head_tiers"] = head["tiers"] if head else []
            d["head_tokens"] = head["n_tokens"] if head else 0
            d["nbytes"] = sum(x["nbytes"] or 0 for x in snaps.values() if x["session"] == s["name"])
            out.append(d)
        return out

    def snapshots(self, session: str | None = None) -> list[dict]:
        if session is not None:
            self.client.session(session)  # NotFound for an unknown session, like the store
        recs = [normalize_snapshot(x) for x in self.client.list_snapshots(session)]
        return _annotate(recs, self._raw_sessions())

    def snapshot(self, sid: str) -> dict:
        d = _annotate([normalize_snapshot(self.client.snapshot_info(sid))], self._raw_sessions())[0]
        d["path"] = str(self.snapshot_path(d["id"]))
        return d

    def snapshot_ids(self) -> list[str]:
        return [normalize_snapshot(x)["id"] for x in self.client.list_snapshots()]

    def session_names(self) -> list[str]:
        return [s["name"] for s in self._raw_sessions()]

    def resolve(self, ref: str) -> str:
        return resolve_prefix(ref, self.snapshot_ids())

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
        res = self.client.branch_snapshot(source, new_session)
        return {k: v for k, v in res.items() if k not in ("success", "conversation_id", "source")}

    def pin(self, sid: str, label: str | None = None) -> dict:
        return normalize_snapshot(self.client.pin_snapshot(sid, label=label))

    def unpin(self, sid: str) -> dict:
        return normalize_snapshot(self.client.unpin_snapshot(sid))

    def gc(self) -> dict:
        res = self.client.gc_snapshots()
        return {k: res.get(k) for k in ("deleted", "freed_bytes", "messages_removed")}

    def import_file(self, file: Path, session: str | None, label: str | None) -> dict:
        """The daemon verifies the file (checksum, format, and the model it belongs to) and stores it."""
        res = self.client.import_snapshot(file.read_bytes(), session=session, label=label)
        return {**normalize_snapshot(res), "messages": res.get("messages")}


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
            res = self.client.restore_snapshot(session=session)
        except NotFound:
            return None
        return {"session": session, "resumed": bool(res.get("tokens")), "restored_tokens": res.get("tokens") or 0,
                "tier": res.get("tier"), "restore_ms": res.get("restore_ms"), "snapshot_id": res.get("snapshot_id"),
                "n_messages": res.get("n_messages")}  # fmt: skip

    def stream(self, session: str, messages: list[dict], sampling: dict) -> Iterator[dict]:
        s = self.client.chat_stream(messages, session=session, model=self.model, **sampling)
        started = False
        try:
            for piece in s:
                if not started:
                    started = True
                    yield {"type": "start", "engram": dict(s.engram)}
                yield {"type": "token", "text": piece}
            if not started:
                yield {"type": "start", "engram": dict(s.engram)}
            yield {"type": "done", "finish_reason": s.finish_reason, "usage": s.usage, "engram": dict(s.engram)}
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

    def save(self, session: str, label: str | None) -> dict:
        return normalize_snapshot(self.client.save_snapshot(session, label=label, pin=True))

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
        return {"session": session, "kept_snapshots": res.get("n_snapshots") or 0,
                "previous_head": res.get("previous_head")}  # fmt: skip

    def snapshot(self, snapshot_id: str) -> dict:
        return normalize_snapshot(self.client.snapshot_info(snapshot_id))


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
