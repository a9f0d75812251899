"""The store's shared state and the low-level helpers every part of it uses.

Store (store.py) is assembled from StoreCore + SessionsMixin (sessions.py: sessions and transcripts)
+ PersistMixin (persist.py: the write path, retention, tiers). All state lives here; one re-entrant
lock (the index's) guards the index, the tier placement and the bookkeeping below. File I/O and
encoding happen outside it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter, deque
from typing import Any, Callable, Sequence

from engramctl.errors import NotFound
from engramctl.settings import Settings
from engramctl.store.crashpoints import crash_point
from engramctl.store.errors import StoreClosed
from engramctl.store.files import SnapshotFiles
from engramctl.store.index import Index
from engramctl.store.names import validate_snapshot_id
from engramctl.store.records import Payload, ReconcileReport, SessionInfo, SnapshotRecord, payload_to
from engramctl.store.transcript import Transcripts
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
        tier_plan: TierPlan,
        clock: Callable[[], float],
        report: ReconcileReport,
        max_pending: int = 32,
    ):
        self.settings, self.clock, self.reconcile_report = settings, clock, report
        self.plan = tier_plan
        self._files, self._index = files, index
        self._transcripts = Transcripts(index)
        self._lock = index.lock
        self._pending: dict[str, Payload] = {}  # committed, not yet durable (the writer's queue)
        self._reading: Counter[str] = Counter()  # being read from disk right now
        self._touched: dict[str, float] = {}  # last_access updates not yet in the index
        self._disk_reserved = 0  # bytes of files being written right now
        self.write_errors: deque[str] = deque(maxlen=20)  # the latest snapshots that could not be saved
        self._closed = False
        memory = [t for t in tier_plan.tiers if t.device is not None and (t.name == "ram" or t.enabled)]
        self._placement = Placement(
            [HotTier(t.name, t.budget_bytes, t.device or "cpu") for t in memory], move=payload_to
        )
        self._writer = Writer(max_pending=max_pending)

    # -- helpers -------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the snapshot store is closed.")

    def _ensure_session(self, name: str, now: float) -> SessionInfo:
        s = self._index.session(name)
        if s is None:
            self._index.insert_session(name=name, created=now, last_used=now)
            s = self._index.session(name)
        return s  # type: ignore[return-value]

    def _row(self, snapshot_id: str) -> SnapshotRecord:
        self._check_open()
        rec = self._index.snapshot(validate_snapshot_id(snapshot_id))
        if rec is None:
            raise NotFound(f"no snapshot {snapshot_id}.", hint="engramctl snapshots ls")
        return rec

    def _set(self, snapshot_id: str, **fields: Any) -> SnapshotRecord:
        with self._lock:
            rec = self._row(snapshot_id)
            self._index.update_snapshot(rec.id, **fields)
            return self._with_tiers(self._index.snapshot(rec.id))  # type: ignore[arg-type]

    def _with_tiers(self, rec: SnapshotRecord) -> SnapshotRecord:
        hot = self._placement.where(rec.id)
        tiers = ((hot,) if hot else ()) + (("disk",) if rec.durable else ())
        last = self._touched.get(rec.id, rec.last_access)
        return dataclasses.replace(rec, tiers=tiers, last_access=last)

    def _busy(self) -> set[str]:
        return set(self._pending) | set(self._reading)

    def _done_reading(self, sid: str) -> None:
        self._reading[sid] -= 1
        if self._reading[sid] <= 0:
            del self._reading[sid]
        self._placement.release(sid)

    def _token_ids(self, sid: str) -> list[int] | None:
        with self._lock:
            hit = self._placement.get(sid, touch=False)
            payload = hit[0] if hit else self._pending.get(sid)
            if payload is not None:
                t = payload[0].get("token_ids")
                return None if t is None else t.tolist()
        return self._files.token_ids(sid)

    def _flush_touches(self) -> None:
        if self._touched:
            with self._index.tx():
                for sid, t in self._touched.items():
                    self._index.execute("UPDATE snapshots SET last_access = ? WHERE id = ?", (t, sid))
            self._touched.clear()

    def _remove(self, ids: Sequence[str]) -> int:
        """Delete snapshots everywhere: hot copies, pending writes, files, then rows. Returns bytes freed."""
        freed = 0
        for sid in ids:
            if sid in self._pending:
                del self._pending[sid]
                self._placement.release(sid)
            self._placement.drop(sid)
            freed += self._files.size(sid) or 0
            self._files.unlink(sid)
            self._touched.pop(sid, None)
        if ids:
            crash_point("remove.unlinked")
        moved = self._index.remove_snapshots(ids)
        if moved:
            log.info("session heads moved after deleting snapshots: %s", moved)
        return freed
