"""What the store's parts share: the index and its lock, the files, the hot copies, the pending writes.

Store (store.py) is composed of parts, each one noun: Snapshots (snapshots.py: commit, the write job,
load, delete), Sessions (sessions.py), Transcripts (transcript.py), NameTable (name_table.py: the Engram
API's names) and Retention (retention.py: budgets, keep-last-N, TTL, gc). They all work on this one
StoreCore. One re-entrant lock (the index's) guards the index, the hot copies and the bookkeeping below;
file I/O and encoding happen outside it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter, deque
from typing import Any, Callable, Sequence

from engramctl.errors import NotFound, StoreClosed
from engramctl.settings import Settings
from engramctl.store.crashpoints import crash_point
from engramctl.store.files import SnapshotFiles
from engramctl.store.index import Index
from engramctl.store.messages import MessageTree
from engramctl.store.names import validate_snapshot_id
from engramctl.store.records import Payload, ReconcileReport, SessionInfo, SnapshotRecord, payload_to
from engramctl.store.writer import Writer
from engramctl.tiers.placement import HotTier, Placement
from engramctl.tiers.plan import TierPlan

log = logging.getLogger("engramctl.store")


class StoreCore:
    def __init__(
        self,
        settings: Settings,
        files: SnapshotFiles,
        index: Index,
        clock: Callable[[], float],
        report: ReconcileReport,
        max_pending: int = 32,
    ):
        self.settings, self.clock, self.reconcile_report = settings, clock, report
        self.files, self.index = files, index
        self.messages = MessageTree(index)
        self.lock = index.lock
        self.pending: dict[str, Payload] = {}  # committed, not yet durable (the writer's queue)
        self.promised: dict[str, int] = {}  # of those, the bytes each is expected to add on disk
        self.reading: Counter[str] = Counter()  # being read from disk right now
        self.touched: dict[str, float] = {}  # last_access updates not yet in the index
        self.disk_reserved = 0  # bytes of files being written right now
        self.write_errors: deque[str] = deque(maxlen=20)  # the latest snapshots that could not be saved
        self.closed = False
        # Budgets come from the tier plan the store follows (Retention.follow); until then RAM holds nothing.
        self.budgets: TierPlan | None = None
        self.placement = Placement([HotTier("ram", 0, "cpu")], move=payload_to)
        self.writer = Writer(max_pending=max_pending)

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosed("the snapshot store is closed.")

    def disk_budget(self) -> int:
        return 0 if self.budgets is None else self.budgets.budget("disk")

    def ensure_session(self, name: str, now: float) -> SessionInfo:
        s = self.index.session(name)
        if s is None:
            self.index.insert_session(name=name, created=now, last_used=now)
            s = self.index.session(name)
        return s  # type: ignore[return-value]

    def row(self, snapshot_id: str) -> SnapshotRecord:
        self.check_open()
        rec = self.index.snapshot(validate_snapshot_id(snapshot_id))
        if rec is None:
            raise NotFound(f"no snapshot {snapshot_id}.", hint="engramctl snapshots ls")
        return rec

    def set(self, snapshot_id: str, **fields: Any) -> SnapshotRecord:
        with self.lock:
            rec = self.row(snapshot_id)
            self.index.update_snapshot(rec.id, **fields)
            return self.with_tiers(self.index.snapshot(rec.id))  # type: ignore[arg-type]

    def tiers_of(self, snapshot_id: str, durable: bool) -> tuple[str, ...]:
        """Where a snapshot is: the memory tier holding it, if any, then disk once its files are complete."""
        hot = self.placement.where(snapshot_id)
        return ((hot,) if hot else ()) + (("disk",) if durable else ())

    def with_tiers(self, rec: SnapshotRecord) -> SnapshotRecord:
        tiers = self.tiers_of(rec.id, rec.durable)
        last = self.touched.get(rec.id, rec.last_access)
        if tiers == rec.tiers and last == rec.last_access:
            return rec  # the index's record says it all already (a listing of thousands: no copy of each)
        return dataclasses.replace(rec, tiers=tiers, last_access=last)

    def with_head_tiers(self, s: SessionInfo) -> SessionInfo:
        """`s` with its head's tiers, the memory tier among them (the index knows only disk)."""
        if s.head is None:
            return s
        tiers = self.tiers_of(s.head, "disk" in s.head_tiers)
        return s if tiers == s.head_tiers else dataclasses.replace(s, head_tiers=tiers)

    def busy(self) -> set[str]:
        return set(self.pending) | set(self.reading)

    def protected(self) -> set[str]:
        """Snapshots no retention rule may delete now: being written or read, a head or a branch point."""
        return self.busy() | self.index.referenced_ids()

    def done_reading(self, sid: str) -> None:
        self.reading[sid] -= 1
        if self.reading[sid] <= 0:
            del self.reading[sid]
        self.placement.release(sid)

    def token_ids(self, sid: str) -> list[int] | None:
        with self.lock:
            hit = self.placement.get(sid, touch=False)
            payload = hit[0] if hit else self.pending.get(sid)
            if payload is not None:
                t = payload[0].get("token_ids")
                return None if t is None else t.tolist()
        return self.files.token_ids(sid)

    def flush_touches(self) -> None:
        if self.touched:
            with self.index.tx():
                for sid, t in self.touched.items():
                    self.index.execute("UPDATE snapshots SET last_access = ? WHERE id = ?", (t, sid))
            self.touched.clear()

    def remove(self, ids: Sequence[str]) -> int:
        """Delete snapshots (or prefix states) everywhere: hot copies, pending writes, their own files, then
        rows; in the rows' transaction the KV blocks nothing uses any more lose theirs (looked up among the
        blocks these used: the cost is what it frees), and their files go once it commits (a crash in between
        leaves files no row names, which reconcile deletes). Returns bytes freed."""
        freed = 0
        for sid in ids:
            if sid in self.pending:
                del self.pending[sid]
                self.promised.pop(sid, None)
                self.placement.release(sid)
            self.placement.drop(sid)
            freed += self.files.size(sid) or 0
            self.files.unlink(sid)
            self.touched.pop(sid, None)
        if ids:
            crash_point("remove.unlinked")
        with self.index.tx():
            used = self.index.block_ids_of_all(ids) if ids else []
            moved = self.index.remove_snapshots(ids)
            unused = self.index.drop_unused_blocks(among=used) if used else []
            if unused:
                self.index.after_commit(lambda: self._unlink_blocks([bid for bid, _ in unused]))
        freed += sum(n for _, n in unused)
        if moved:
            log.info("session heads moved after deleting snapshots: %s", moved)
        return freed

    def _unlink_blocks(self, block_ids: Sequence[str]) -> None:
        crash_point("remove.blocks_indexed")
        for bid in block_ids:
            try:
                self.files.unlink_block(bid)
            except OSError as e:  # no row names it any more: the next open's reconcile deletes it
                log.warning("could not delete KV block %s: %s", bid, e)
