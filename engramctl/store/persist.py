"""The write-through path, retention and the tiers (part of Store; see core.py).

Every commit becomes one writer-thread job (`_write`): encode, make room inside the disk budget,
write atomically, mark durable, apply keep-last-N to that session. A snapshot that cannot be made
durable is dropped as a crash would drop it (`_abandon`).
"""

from __future__ import annotations

import logging
from typing import Any

from engramctl.store import retention, snapshot_file
from engramctl.store.core import StoreCore
from engramctl.store.crashpoints import crash_point
from engramctl.store.reconcile import checksum_of, verify_file
from engramctl.store.errors import DiskFull
from engramctl.store.records import GcReport, payload_nbytes
from engramctl.tiers.hardware import Hardware, detect_hardware
from engramctl.tiers.placement import HotTier
from engramctl.tiers.plan import TableClaim, TierPlan, keep_tables, plan, plan_json

log = logging.getLogger("engramctl.store")

# Over a snapshot's tensor bytes: its header and the file system's rounding, and room kept for the index's
# transcript writes, so that a disk full of snapshots still records the conversation.
FILE_SLACK_BYTES = 256 * 1024


class PersistMixin(StoreCore):
    _table_claims: tuple[TableClaim, ...] = ()  # the N-gram tables Store.claim_tables placed (immutable)

    def usage(self) -> dict[str, tuple[int, int]]:
        """tier name -> (bytes used, snapshot count)."""
        with self._lock:
            out = {t.name: (0, 0) for t in self.plan.tiers}
            out.update(self._placement.usage())
            out["disk"] = self._index.durable_bytes()
            return out

    def plan_json(self) -> dict[str, Any]:
        return plan_json(self.plan, self.usage())

    def replan(self, model_bytes: int = 0, model_on_cpu: bool = True, hardware: Hardware | None = None) -> TierPlan:
        """Re-plan budgets (after loading a model, say); shrinking tiers evict at once."""
        hw = hardware or detect_hardware(self.settings.paths.data_dir)
        with self._lock:
            new = plan(hw, self.settings, model_bytes, model_on_cpu, stored_disk_bytes=self._index.durable_bytes()[0])
            if self._table_claims:  # a loaded N-gram table does not move: claimed again where it is
                new = keep_tables(new, self._table_claims)
            if new.tier("vram").enabled and self._placement.tiers[0].name != "vram":
                # CUDA seen only now (opened before torch was imported): the hottest tier joins, empty
                self._placement.tiers.insert(0, HotTier("vram", 0, new.tier("vram").device or "cuda"))
            self._apply_plan(new)
        return new

    def _apply_plan(self, new: TierPlan) -> None:
        """Make `new` the plan: budgets set (shrinking tiers evict at once), the disk budget enforced."""
        for tier in self._placement.tiers:
            self._placement.set_budget(tier.name, new.budget(tier.name))
        self.plan = new
        self._enforce_disk(GcReport())

    def gc(self) -> GcReport:
        """Apply retention now (keep-last-N, TTL, disk budget) and drop unreachable messages."""
        report = GcReport()
        with self._lock, self._index.tx():
            self._check_open()
            self._flush_touches()
            busy = self._busy()
            protected = busy | self._index.referenced_ids()
            for sid in retention.keep_last_victims(self._index.snapshots(), self.settings.keep_last, protected):
                report.deleted[sid] = "keep_last"
            ttl = self.settings.session_ttl_s
            if ttl is not None:
                for sid in retention.ttl_victims(
                    self._index.sessions(), self._index.snapshots(), self.clock(), ttl, busy
                ):
                    report.deleted.setdefault(sid, "ttl")
            report.freed_bytes += self._remove(list(report.deleted))
            self._enforce_disk(report)
            report.messages_removed = self._transcripts.collect()
        return report

    def verify(self) -> dict[str, str]:
        """Check every durable snapshot's checksum; quarantine corrupt ones. Returns {id: reason}."""
        bad: dict[str, str] = {}
        with self._lock:
            self._check_open()
            records = self._index.snapshots()
        for rec in records:
            if not rec.durable:
                continue
            _, reason = verify_file(self._files, rec.id)
            if reason is not None:
                with self._lock:
                    if self._index.snapshot(rec.id) is not None:
                        self._files.quarantine(self._files.path(rec.id), reason)
                        self._remove([rec.id])
                        bad[rec.id] = reason
        return bad

    # -- write path ----------------------------------------------------------------------------------
    def _check_disk_room(self, nbytes: int) -> None:
        """Refuse a commit whose file cannot fit on the file system, counting the writes already queued:
        a full disk then fails the turn's snapshot at once, in its result, instead of after the reply
        (the writer's ENOSPC path, `_abandon`, still catches what a racing writer fills)."""
        free = self._files.free_bytes()
        if free is None:
            return
        queued = sum(payload_nbytes(p) for p in self._pending.values())
        need = nbytes + FILE_SLACK_BYTES
        if free - queued < need:
            msg = (
                f"the snapshot could not be saved: the file system of {self._files.snapshots} has "
                f"{free} bytes free ({queued} of them promised to queued writes) and it needs about {need}."
            )
            self.write_errors.append(msg)
            raise DiskFull(msg, hint="free some disk space (or lower keep_last); snapshots resume by themselves")

    def _enforce_disk(self, report: GcReport) -> None:
        used = self._index.durable_bytes()[0] + self._disk_reserved
        protected = self._busy() | self._index.referenced_ids()
        victims, _ = retention.disk_victims(self._index.snapshots(), used, 0, self.plan.budget("disk"), protected)
        for sid in victims:
            report.deleted[sid] = "disk_budget"
        if victims:
            log.warning("disk budget %d bytes: deleting %d snapshot(s)", self.plan.budget("disk"), len(victims))
        report.freed_bytes += self._remove(victims)

    def _make_disk_room(self, need: int) -> bool:
        self._flush_touches()
        used = self._index.durable_bytes()[0] + self._disk_reserved
        protected = self._busy() | self._index.referenced_ids()
        victims, fits = retention.disk_victims(self._index.snapshots(), used, need, self.plan.budget("disk"), protected)
        if fits and victims:
            log.info("disk budget: evicting %d snapshot(s) to make room", len(victims))
            self._remove(victims)
        return fits

    def _abandon(self, sid: str, reason: str) -> None:
        """A committed snapshot that will never be durable: drop it as a crash would."""
        with self._lock:
            msg = f"snapshot {sid} could not be saved: {reason}"
            log.error("%s", msg)
            self.write_errors.append(msg)
            if sid in self._pending and not self._closed:
                self._remove([sid])

    def _write(self, sid: str) -> None:
        """Writer-thread job: encode, make room within the disk budget, write atomically, mark durable."""
        with self._lock:
            payload = self._pending.get(sid)
        if payload is None:
            return  # deleted before it was written
        try:
            buf = snapshot_file.encode(*payload)
        except Exception as e:
            return self._abandon(sid, f"could not encode it ({e})")
        crash_point("write.encoded")
        need = len(buf)
        with self._lock:
            if sid not in self._pending:
                return
            if not self._make_disk_room(need):
                used = self._index.durable_bytes()[0]
                return self._abandon(
                    sid,
                    f"the disk tier is full ({used} of {self.plan.budget('disk')} bytes "
                    f"used by pinned or in-use snapshots; this one needs {need})",
                )
            self._disk_reserved += need
        try:
            self._files.write(sid, buf)
        except OSError as e:
            with self._lock:
                self._disk_reserved -= need
            return self._abandon(sid, f"writing the file failed ({e})")
        crash_point("write.renamed")
        with self._lock:
            self._disk_reserved -= need
            if sid not in self._pending or self._index.snapshot(sid) is None:
                self._files.unlink(sid)  # deleted while being written
                return
            self._index.update_snapshot(sid, durable=1, nbytes=need, checksum=checksum_of(buf))
            del self._pending[sid]
            self._placement.release(sid)
            crash_point("write.indexed")
            owner = self._index.snapshot(sid).session  # type: ignore[union-attr]
            protected = self._busy() | self._index.referenced_ids()
            self._remove(retention.keep_last_victims(self._index.snapshots(owner), self.settings.keep_last, protected))
