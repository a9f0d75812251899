"""Where the CLI reads and changes sessions and snapshots.

Two implementations with one shape (plain JSON-able dicts):

- LocalCatalog: opens the store directly (engramctl.store.store.Store). Used when no daemon holds it.
- DaemonCatalog: the running daemon, through engramctl.client. Used when the daemon has the store
  open (the store takes an exclusive lock), so changes go through the process that owns the data.

`open_catalog(settings)` picks: the store if it can be opened, else the daemon. Nothing here starts
a daemon. Importing this module is cheap; the store (torch) is imported only when opened.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from engramctl.errors import EngramError, NotFound, UsageError

MIN_PREFIX = 6


def resolve_prefix(ref: str, ids: list[str]) -> str:
    """A full snapshot id from a full id or a unique prefix of 6+ lowercase hex digits."""
    ref = ref.strip().lower()
    if not ref or any(c not in "0123456789abcdef" for c in ref) or len(ref) > 32:
        raise UsageError(f"{ref[:40]!r} is not a snapshot id (32 hex digits) or an id prefix.",
                         hint="engramctl snapshots ls")  # fmt: skip
    if len(ref) < MIN_PREFIX:
        raise UsageError(f"snapshot id prefix {ref!r} is too short; give at least {MIN_PREFIX} characters.",
                         hint="engramctl snapshots ls")  # fmt: skip
    found = [i for i in ids if i.startswith(ref)]
    if not found:
        raise NotFound(f"no snapshot id starts with {ref!r}.", hint="engramctl snapshots ls")
    if len(found) > 1:
        raise UsageError(f"snapshot id prefix {ref!r} matches {len(found)} snapshots; give more characters.",
                         hint="engramctl snapshots ls")  # fmt: skip
    return found[0]


def _annotate(snaps: list[dict], sessions: list[dict]) -> list[dict]:
    """Add `head_of` / `branch_point_of`: the sessions that need each snapshot."""
    heads: dict[str, list[str]] = {}
    bases: dict[str, list[str]] = {}
    for s in sessions:
        if s.get("head"):
            heads.setdefault(s["head"], []).append(s["name"])
        if s.get("base"):
            bases.setdefault(s["base"], []).append(s["name"])
    for snap in snaps:
        snap["head_of"] = heads.get(snap["id"], [])
        snap["branch_point_of"] = bases.get(snap["id"], [])
    return snaps


class LocalCatalog:
    via = "store"

    def __init__(self, store: Any):
        self.store = store

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "LocalCatalog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reads ---------------------------------------------------------------------------------------
    def sessions(self) -> list[dict]:
        out = []
        snaps = {r.id: r for r in self.store.list()}
        for s in self.store.list_sessions():
            d = s.to_json()
            head = snaps.get(s.head) if s.head else None
            d["head_tiers"] = list(head.tiers) if head else []
            d["head_tokens"] = head.n_tokens if head else 0
            d["nbytes"] = sum(r.nbytes for r in snaps.values() if r.session == s.name)
            out.append(d)
        return out

    def snapshots(self, session: str | None = None) -> list[dict]:
        recs = [r.to_json() for r in self.store.list(session)]
        return _annotate(recs, [s.to_json() for s in self.store.list_sessions()])

    def snapshot(self, sid: str) -> dict:
        d = _annotate([self.store.info(sid).to_json()], [s.to_json() for s in self.store.list_sessions()])[0]
        d["path"] = str(self.snapshot_path(sid))
        return d

    def snapshot_ids(self) -> list[str]:
        return [r.id for r in self.store.list()]

    def session_names(self) -> list[str]:
        return [s.name for s in self.store.list_sessions()]

    def resolve(self, ref: str) -> str:
        return resolve_prefix(ref, self.snapshot_ids())

    def transcript(self, session: str) -> list[dict]:
        return self.store.transcript(session)

    def snapshot_transcript(self, sid: str) -> list[dict]:
        return self.store.snapshot_transcript(sid)

    def tiers(self) -> dict:
        return self.store.plan_json()

    def snapshot_path(self, sid: str) -> Path:
        from engramctl.store.files import SnapshotFiles

        return SnapshotFiles(self.store.settings.paths.data_dir).path(sid)

    # -- changes -------------------------------------------------------------------------------------
    def delete(self, ids: list[str], force: bool = False) -> dict:
        freed, deleted = 0, []
        for sid in ids:
            rec = self.store.info(sid)
            self.store.delete(sid, force=force)
            freed += rec.nbytes if rec.durable else 0
            deleted.append(sid)
        return {"deleted": deleted, "freed_bytes": freed}

    def delete_session(self, name: str) -> dict:
        sizes = {r.id: (r.nbytes if r.durable else 0) for r in self.store.list(name)}
        deleted = self.store.delete_session(name)
        return {"session": name, "deleted": deleted, "freed_bytes": sum(sizes.get(i, 0) for i in deleted)}

    def pin(self, sid: str, label: str | None = None) -> dict:
        if label is not None:
            self.store.label(sid, label)
        return self.store.pin(sid).to_json()

    def unpin(self, sid: str) -> dict:
        return self.store.unpin(sid).to_json()

    def branch(self, source: str, new_session: str) -> dict:
        return self.store.branch(source, new_session).to_json()

    def gc(self) -> dict:
        return self.store.gc().to_json()

    def import_file(self, file: Path, session: str | None, label: str | None) -> dict:
        """Checksum and format are verified here; the model fingerprint when the daemon loads it."""
        from engramctl.store.exchange import unpack
        from engramctl.store.names import validate_session_name

        payload, messages, recorded = unpack(file.read_bytes(), source=f"snapshot {file.name}")
        name = session or recorded
        if not name:
            raise UsageError(f"{file.name} does not record a session name.", hint="pass one: --session NAME")
        validate_session_name(name)
        if name in self.session_names():
            raise UsageError(f"session {name!r} already exists.", hint="import it under another name: --session NEW")
        rec = self.store.commit(name, payload, messages=messages or None, label=label)
        self.store.flush()
        return {**self.store.info(rec.id).to_json(), "messages": len(messages)}


def open_local(settings: Any) -> LocalCatalog:
    from engramctl.store.store import Store

    return LocalCatalog(Store.open(settings))


def open_catalog(settings: Any, *, wait_s: float = 2.0, starting_wait_s: float = 120.0) -> Any:
    """The store when this process can open it, else the daemon that holds it.

    A brief lock held by another CLI command is waited out (up to wait_s); a daemon that is still
    loading its model is waited for (up to starting_wait_s)."""
    from engramctl.cli import daemonlink
    from engramctl.store.errors import StoreLocked

    info = daemonlink.status(settings)
    if info is not None and info.get("ready"):  # the daemon owns the store: ask it (and skip importing torch)
        return daemonlink.daemon_catalog(settings)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return open_local(settings)
        except StoreLocked as locked:
            info = daemonlink.status(settings)
            if info is not None and not info.get("ready"):
                deadline = max(deadline, time.monotonic() + starting_wait_s) if info else deadline
            elif info is not None:
                return daemonlink.daemon_catalog(settings)
            if time.monotonic() >= deadline:
                if info is not None:
                    raise EngramError("the daemon is still starting (loading its model).",
                                      hint="try again in a moment; engramctl daemon status") from None  # fmt: skip
                raise EngramError(locked.message, hint=locked.hint) from None
            time.sleep(0.1)
