"""The snapshot store: the one object the daemon talks to, composed of parts with one noun each.

    store = Store.open(settings)                 # reconciles the index with the files, starts the writer
    tiers = TierPlanner.start(settings, store.retention)  # its owner's tier plan; the store keeps within it
    rec = store.snapshots.commit("chat", payload, messages=[{"role": "user", "content": "hi"}])
    tensors, meta = store.snapshots.load(rec.id) # hottest tier that has it, else disk (verified)
    store.flush(); store.close()

Parts (all over one StoreCore, core.py):
  store.snapshots    snapshots.py   commit (and the write that makes it durable), load, info, list, delete,
                                    pin, label, wait_durable
  store.sessions     sessions.py    create, get, has, list, touch, head, history, branch, set_head, reset
  store.transcripts  transcript.py  a session's or a snapshot's transcript: append, replace, truncate
  store.names        name_table.py  the Engram API's names: turns, branch names, custom ids, the latest save
  store.retention    retention.py   keep-last-N, TTL, the disk and prefix budgets, gc; follows the tier plan
  store.prefixes     prefixes.py    prefix states: put, load (shared prompt beginnings, no session)
  store.candidates   candidates.py  the snapshots and prefix states a prompt's token ids could start from
Storage: a snapshot's attention KV is kept in content-addressed blocks shared by every snapshot and prefix
state holding the same tokens (blocks.py); its own file holds the rest. A load joins them (bitwise the payload
committed); `snapshots export` still writes one self-contained file (files.read_payload).
The tier plan is not the store's: its owner (the daemon: Daemon.tiers; the bench; a listing without a daemon)
builds a tiers/planner.py TierPlanner over store.retention, and the store commits nothing before it planned.
Callers use the parts (`store.sessions.branch(...)`); the store's own methods are open, close, flush,
pending_writes, resolve, delete_session and verify.

Durability: `commit` puts the payload in the hottest memory tier with room and queues the disk
write; the record says `durable=False` until the file is complete (`flush()` waits, `info()` tells).
A snapshot that cannot be written (disk budget, I/O error) is dropped exactly as if the process had
stopped before writing it: heads fall back to its parent, the transcript is untouched.

Ownership: the store keeps the payload's tensors as given (no copy), so the caller must not mutate
them afterwards; `load` returns the stored tensors (read-only by contract) unless copy=True.
Threads: every method is safe to call from any thread; file I/O happens outside the lock.
Errors: InvalidName for bad names/ids, NotFound, SnapshotCorrupt, errors.SnapshotInUse /
AlreadyExists / StoreLocked / DiskFull.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from engramctl.errors import UsageError
from engramctl.settings import Settings
from engramctl.store.candidates import Candidates
from engramctl.store.core import StoreCore
from engramctl.store.files import SnapshotFiles
from engramctl.store.index import Index
from engramctl.store.name_table import NameTable
from engramctl.store.names import is_snapshot_id, parse_turn_ref
from engramctl.store.prefixes import Prefixes
from engramctl.store.reconcile import reconcile, verify_all
from engramctl.store.retention import Retention
from engramctl.store.sessions import Sessions
from engramctl.store.snapshots import Snapshots
from engramctl.store.transcript import Transcripts


class Store:
    def __init__(self, core: StoreCore):
        self._core = core
        self.settings, self.clock = core.settings, core.clock
        self.reconcile_report, self.write_errors = core.reconcile_report, core.write_errors
        # the internals the crash, tier and full-disk tests reach into
        self._index, self._files, self._placement, self._writer = core.index, core.files, core.placement, core.writer
        self.sessions = Sessions(core)
        self.transcripts = Transcripts(core, self.sessions)
        self.retention = Retention(core)
        self.snapshots = Snapshots(core, self.sessions, self.retention)
        self.names = NameTable(core, self.sessions)
        self.candidates = Candidates(core)
        self.prefixes = Prefixes(core, self.snapshots, self.retention, self.candidates)

    @classmethod
    def open(
        cls,
        settings: Settings,
        clock: Callable[[], float] = time.time,
        *,
        verify: bool = False,
    ) -> "Store":
        """Open (creating if needed) the store under settings.paths.data_dir and reconcile it with its
        files (verify=True also checks every checksum). It reads at once; it commits once a TierPlanner
        gave it a plan (tiers/planner.py)."""
        files = SnapshotFiles(settings.paths.data_dir)
        files.lock()
        index = core = None
        try:
            index = Index(files.index_path)
            report = reconcile(index, files, verify=verify)
            core = StoreCore(settings, files, index, clock, report)
            store = cls(core)
        except BaseException:
            if core is not None:
                core.writer.close()
            if index is not None:
                index.close()
            files.unlock()
            raise
        return store

    def close(self) -> None:
        """Finish pending writes, then release everything. Idempotent."""
        c = self._core
        if c.closed:
            return
        c.writer.close()
        with c.lock:
            c.flush_touches()
            c.closed = True
            c.index.close()
        c.files.unlock()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every committed snapshot is durable (or dropped); False on timeout."""
        c = self._core
        done = c.writer.flush(timeout)
        with c.lock:
            if not c.closed:
                c.flush_touches()
        return done

    @property
    def pending_writes(self) -> int:
        return self._core.writer.pending

    def resolve(self, ref: str) -> str:
        """A full snapshot id from a full id or a unique prefix (Snapshots.resolve_id), or from a name the
        Engram API gave it (name_table.py): a custom snapshot id (looked up first: a client's own name wins
        over an id prefix that reads the same), "<conversation_id>-t<N>"."""
        if isinstance(ref, str) and ref and not is_snapshot_id(ref):
            named = self.names.named(ref)
            if named is not None:
                return named
        try:
            return self.snapshots.resolve_id(ref)
        except UsageError:
            turn = parse_turn_ref(ref)
            if turn is None:
                raise
            return self.names.turn_snapshot(*turn)

    def delete_session(self, name: str) -> list[str]:
        """Delete a session, its transcript and its snapshots but those another session needs (they move to
        it: Sessions.delete), and its names: its saved turns, branch names and the branch name naming it."""
        c = self._core
        with c.lock, c.index.tx():
            self.sessions.get(name)
            self.names.forget_session(name)
            return self.sessions.delete(name)

    def verify(self) -> dict[str, str]:
        """Check every durable snapshot's checksum; quarantine corrupt ones. Returns {id: reason}."""
        return verify_all(self._core)
