"""Where the CLI reads and changes sessions and snapshots.

Two implementations with one shape: both read protocol objects (Snapshot, Session) and hand out the
CLI's rows of them (rows.py: plain JSON-able dicts):

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

from engramctl.cli.rows import session_rows, snapshot_rows
from engramctl.errors import EngramError, UsageError
from engramctl.protocol import Session, Snapshot


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
    def _sessions(self) -> list[Session]:
        return [Session.from_info(s) for s in self.store.list_sessions()]

    def _snapshots(self, session: str | None = None) -> list[Snapshot]:
        return [Snapshot.from_record(r) for r in self.store.list(session)]

    def sessions(self) -> list[dict]:
        return session_rows(self._sessions(), self._snapshots())

    def snapshots(self, session: str | None = None) -> list[dict]:
        return snapshot_rows(self._snapshots(session), self._sessions())

    def snapshot(self, sid: str) -> dict:
        d = snapshot_rows([Snapshot.from_record(self.store.info(sid))], self._sessions())[0]
        d["path"] = str(self.snapshot_path(sid))
        return d

    def snapshot_ids(self) -> list[str]:
        return [r.id for r in self.store.list()]

    def session_names(self) -> list[str]:
        return [s.name for s in self.store.list_sessions()]

    def resolve(self, ref: str) -> str:
        return self.store.resolve(ref)

    def transcript(self, session: str) -> list[dict]:
        return self.store.transcript(session)

    def snapshot_transcript(self, sid: str) -> list[dict]:
        return self.store.snapshot_transcript(sid)

    def tiers(self) -> dict:
        """The store's plan, with the N-gram tables written under the data dir's ngram/ claimed on it
        (no daemon: the tables a model would load; the planner decides RAM or disk the same way)."""
        from engramctl.ngram.table_spec import installed_tables
        from engramctl.tiers.plan import claim_tables, plan_json

        tables = installed_tables(self.store.settings.paths.data_dir / "ngram", recursive=True)
        if not tables:
            return self.store.tiers.plan_json()
        root = self.store.settings.paths.data_dir
        claims = [(str(path.relative_to(root)), meta.spec.size_bytes) for path, meta in tables]
        return plan_json(claim_tables(self.store.tiers.plan, claims), self.store.tiers.usage())

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
        return Snapshot.from_record(self.store.pin(sid)).to_dict()

    def unpin(self, sid: str) -> dict:
        return Snapshot.from_record(self.store.unpin(sid)).to_dict()

    def branch(self, source: str, new_session: str) -> dict:
        return Session.from_info(self.store.branch(source, new_session)).to_json()

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
        return {**Snapshot.from_record(self.store.info(rec.id)).to_dict(), "messages": len(messages)}


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
                    raise EngramError(
                        "the daemon is still starting (loading its model).",
                        hint="try again in a moment; engramctl daemon status",
                    ) from None
                raise EngramError(locked.message, hint=locked.hint) from None
            time.sleep(0.1)
