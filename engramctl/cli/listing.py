"""What the CLI reads: sessions, snapshots, a snapshot's transcript, the tier plan.

From the daemon when one runs (it owns the store, and knows what it holds in memory); else from the
store, opened by this process only to read it, so `snapshots ls`, `ps` and the like work without starting a
daemon. Both hand out protocol objects (Snapshot, Session); rows.py makes the CLI's rows of them once.
Changes never come here: they go through the daemon (connect.py). Torch is imported only with the store.
"""

from __future__ import annotations

from pathlib import Path

TYPE_CHECKING = False  # typing's, without importing typing: `snapshots ls` imports none of it (~4% of its time)
if TYPE_CHECKING:  # the sources that make protocol objects import it themselves: IndexSource makes none
    from typing import Any

    from typing_extensions import Self

    from engramctl.protocol import Session, Snapshot


class DaemonSource:
    """Reads over the daemon's client."""

    def __init__(self, client: Any):
        self.client = client

    def close(self) -> None:
        self.client.close()

    def sessions(self) -> tuple[list[Session], set[str] | None]:
        from engramctl.protocol import Session

        listed = self.client.sessions()
        return [Session.from_json(s) for s in listed], {s["name"] for s in listed if s.get("hot")}

    def session_refs(self) -> list[tuple[str, str | None, str | None]]:
        return [(s.name, s.head, s.base) for s in self.sessions()[0]]

    def snapshots(self, session: str | None) -> list[Snapshot]:
        from engramctl.protocol import Snapshot

        if session is not None:
            self.client.session(session)  # NotFound for an unknown session, like the store
        return [Snapshot.from_json(x) for x in self.client.list_snapshots(session)]

    def snapshot_rows(self, session: str | None) -> list[dict]:
        return _rows_of_snapshots(self, session)

    def snapshot(self, ref: str) -> Snapshot:
        from engramctl.protocol import Snapshot

        return Snapshot.from_json(self.client.snapshot_info(ref))  # the daemon resolves a prefix by the store's rule

    def snapshot_transcript(self, sid: str) -> list[dict]:
        return list(self.client.snapshot_transcript(sid).get("messages") or [])

    def tiers(self) -> dict:
        return self.client.tiers()

    def freed_bytes(self, ids: list[str]) -> int:
        return self.client.freed_bytes(ids)


class StoreSource:
    """Reads from the store, opened by this process while no daemon runs."""

    def __init__(self, store: Any):
        self.store = store

    def close(self) -> None:
        self.store.close()

    def sessions(self) -> tuple[list[Session], set[str] | None]:
        from engramctl.protocol import Session

        return [Session.from_info(s) for s in self.store.sessions.list()], None  # nothing is in memory

    def session_refs(self) -> list[tuple[str, str | None, str | None]]:
        return [(s.name, s.head, s.base) for s in self.store.sessions.list()]

    def snapshots(self, session: str | None) -> list[Snapshot]:
        from engramctl.protocol import Snapshot

        return [Snapshot.from_record(r) for r in self.store.snapshots.list(session)]

    def snapshot_rows(self, session: str | None) -> list[dict]:
        return _rows_of_snapshots(self, session)

    def snapshot(self, ref: str) -> Snapshot:
        from engramctl.protocol import Snapshot

        return Snapshot.from_record(self.store.snapshots.info(self.store.resolve(ref)))

    def snapshot_transcript(self, sid: str) -> list[dict]:
        return self.store.transcripts.of_snapshot(sid)

    def freed_bytes(self, ids: list[str]) -> int:
        return self.store.snapshots.freed_bytes(ids)

    def tiers(self) -> dict:
        """The plan a daemon would make now, with the N-gram tables written under the data dir's ngram/
        claimed on it (the tables a model would load; the planner decides RAM or disk as the daemon's would)."""
        from engramctl.ngram.table_spec import installed_tables
        from engramctl.tiers.plan import claim_tables, plan_json
        from engramctl.tiers.planner import TierPlanner

        planner = TierPlanner.start(self.store.settings, self.store.retention)  # the daemon's first plan, as it opens
        root = self.store.settings.paths.data_dir
        tables = installed_tables(root / "ngram", recursive=True)
        prefixes = {"prefix_states": self.store.prefixes.usage_json()}
        if not tables:
            return planner.plan_json() | prefixes
        # shown on the plan, not claimed on the store: a listing shrinks no budget the store keeps within
        claims = [(str(path.relative_to(root)), meta.spec.size_bytes) for path, meta in tables]
        return plan_json(claim_tables(planner.plan, claims), self.store.retention.usage()) | prefixes


def _rows_of_snapshots(source: DaemonSource | StoreSource, session: str | None) -> list[dict]:
    """rows.snapshot_rows of a source's Snapshot objects (IndexSource makes the same rows without them)."""
    from engramctl.cli.rows import snapshot_rows

    return snapshot_rows([s.to_dict() for s in source.snapshots(session)], source.session_refs())


class IndexSource:
    """Reads the store's index, opened only to read it, while no daemon runs (`snapshots ls`, `sessions`, `ps`):
    no lock, no reconcile, nothing written, so a listing costs its one read (store/listing.py), not an open of the
    store. It shows what the last committed transaction holds, less the snapshots whose files are not complete (a
    write in progress, or cut short by a crash: the next open of the store drops or adopts them); a session whose
    head is such a snapshot shows no tiers for it."""

    def __init__(self, index: Any):
        self.index = index  # None: no store yet, nothing to list

    def close(self) -> None:
        if self.index is not None:
            self.index.close()

    def sessions(self) -> tuple[list[Session], set[str] | None]:
        from engramctl.protocol import Session

        if self.index is None:
            return [], None
        return [Session.from_info(s) for s in self.index.sessions()], None  # nothing is in memory

    def snapshot_rows(self, session: str | None) -> list[dict]:
        """The rows rows.snapshot_rows makes of Snapshot.to_dict()'s, from one query (store/listing.py)."""
        if session is not None:
            from engramctl.errors import NotFound
            from engramctl.store.names import validate_session_name

            validate_session_name(session)
            if self.index is None or not self.index.has_session(session):
                raise NotFound(f"no session named {session!r}.", hint="engramctl sessions")  # as Sessions.get
        if self.index is None:
            return []
        from engramctl.store.listing import listed

        return listed(self.index, session)


class Listing:
    """The CLI's rows of sessions and snapshots (rows.py), whichever source read them."""

    def __init__(self, source: Any, paths: Any):
        self.source, self.paths = source, paths

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sessions(self) -> list[dict]:
        from engramctl.cli.rows import session_rows

        sessions, hot = self.source.sessions()  # each with its head's tokens and tiers: no snapshot listed for them
        return session_rows(sessions, hot)

    def session_names(self) -> list[str]:
        return [s.name for s in self.source.sessions()[0]]

    def snapshots(self, session: str | None = None) -> list[dict]:
        return self.source.snapshot_rows(session)

    def snapshot(self, ref: str) -> dict:
        """One snapshot by id or unique id prefix (store.names' rule), with the path of its file."""
        from engramctl.cli.rows import snapshot_rows

        row = snapshot_rows([self.source.snapshot(ref).to_dict()], self.source.session_refs())[0]
        row["path"] = str(self.snapshot_path(row["id"]))
        return row

    def snapshot_path(self, sid: str) -> Path:
        from engramctl.store.names import snapshot_filename

        return self.paths.data_dir / "snapshots" / snapshot_filename(sid)  # the layout of store/files.py

    def snapshot_transcript(self, sid: str) -> list[dict]:
        """The transcript exactly as it was when `sid` was taken."""
        return self.source.snapshot_transcript(sid)

    def tiers(self) -> dict:
        return self.source.tiers()

    def freed_bytes(self, ids: list[str]) -> int:
        """What deleting these snapshots together frees: the blocks they share with each other included,
        those other snapshots still use left out."""
        return self.source.freed_bytes(ids) if ids else 0


def over(client: Any) -> Listing:
    """A listing over a client the caller connected (a change command previews through it)."""
    return Listing(DaemonSource(client), client.settings.paths)


def open_listing(settings: Any, out: Any, *, read_only: bool = False) -> Listing:
    """The running daemon's listing, else the store's. A daemon still loading its model may not hold the
    store yet: then the store is read, or, once the daemon holds it, the daemon is waited for.
    read_only: a listing of sessions and snapshots only (no tiers, transcripts or sizes freed), read from the
    index alone (IndexSource) while no ready daemon runs; a store whose index needs migrating is opened as usual.
    settings: the Settings, or None to load them only where they are used: a read-only listing of the index alone
    needs only Paths (`snapshots ls` then imports no settings, paths.py)."""
    from engramctl.errors import StoreLocked

    paths = _paths() if settings is None else settings.paths
    info = None
    if read_only:
        from engramctl.daemon.rundir import running_pid

        if running_pid(paths) is not None:  # none: no daemon's imports, nor the settings'
            settings = settings or _settings()
            info = _running(settings)
    else:
        settings = settings or _settings()
        info = _running(settings)
    if read_only and (info is None or not info.get("ready")):
        from engramctl.store.index import Index

        path = paths.data_dir / "index.db"
        index = Index.read_only(path)
        if index is not None or not path.exists():
            return Listing(IndexSource(index), paths)
    settings = settings or _settings()
    if info is None or not info.get("ready"):
        from engramctl.store.store import Store

        try:
            return Listing(StoreSource(Store.open(settings)), paths)
        except StoreLocked:
            if _running(settings) is None:  # another engramctl command has it open for a moment
                raise
    from engramctl.cli import connect

    return over(connect.connect(settings, out, start=False)[0])


def _paths() -> Any:
    import os

    from engramctl.paths import Paths

    return Paths.from_env(os.environ)


def _settings() -> Any:
    from engramctl.settings import load_settings

    return load_settings({})


def _running(settings: Any) -> dict | None:
    """connect.running, imported only where a daemon may run: connect.py imports protocol, which a listing of the
    index alone never needs."""
    from engramctl.cli import connect

    return connect.running(settings)
