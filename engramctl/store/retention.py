"""Which snapshots to delete, and keeping the store within its budgets (a Store part: `store.retention`).

The functions are pure decisions over index records; Retention acts on them: it follows the tier plan
(TierPlanner, tiers/planner.py, tells it each new plan: hot-tier budgets, the disk budget), applies the
rules below after each write and in `gc`, and refuses a commit the file system has no room for.

Defaults (Settings): keep_last = 8 per session, session_ttl_s = None (off), disk budget from the tier
plan. The rules, in the order `Retention.gc` applies them:

1. keep-last-N: per owning session, the N newest snapshots stay; older ones go unless protected.
2. TTL (optional): a session unused for longer than session_ttl_s loses its unprotected snapshots,
   its own head included; its transcript stays, so it resumes by re-prefilling.
3. disk budget: while the durable bytes (own files and KV blocks, each block once) exceed the budget,
   delete the least recently used unprotected snapshots and prefix states, unlabelled ones before labelled
   ones; a deletion frees its own file and the blocks nothing else uses (own_size_bytes).

Cost (issue 46): a write asks the index's running totals whether it fits (schema 4) and lists nothing when it
does; when it does not, victims are read along the index over the eviction order only as far as they make room,
each counted with the blocks it frees together with the victims before it (Index.freed_along); keep-last reads
the written session's rows. Nothing a write runs grows with the number of snapshots the store holds, except the
heads and branch points the eviction order skips (they are protected: an indexed lookup each).
4. prefix budget: prefix states (store/prefixes.py) are kept within Settings.prefix_state_bytes (their own
   files and the KV blocks they use), least recently used first, after each one is written and in `gc`.

Protected, always: pinned snapshots (never evicted by any rule), snapshots being written or read,
and snapshots another live session depends on (its head or its branch point). Rules 1 and 2 also
keep labelled snapshots; rule 1 keeps every session's head and branch point.
Explicit deletes (Snapshots.delete, Store.delete_session) are the user's decision, not retention.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from typing import Iterable, Iterator

from engramctl.store.core import StoreCore
from engramctl.errors import DiskFull
from engramctl.store.records import GcReport, SessionInfo, SnapshotRecord
from engramctl.tiers.placement import HotTier
from engramctl.tiers.plan import TierPlan

log = logging.getLogger("engramctl.store")

# Over a snapshot's tensor bytes: its header and the file system's rounding, and room kept for the index's
# transcript writes, so that a disk full of snapshots still records the conversation.
FILE_SLACK_BYTES = 256 * 1024
PREFIX_DEFAULT_MAX_BYTES = 2 * 2**30


def _evictable(s: SnapshotRecord, protected: set[str]) -> bool:
    return s.durable and not s.pinned and s.id not in protected


def keep_last_victims(snaps: Iterable[SnapshotRecord], keep_last: int, protected: set[str]) -> list[str]:
    """Snapshots beyond the newest `keep_last` of their session that nothing protects."""
    by_session: dict[str, list[SnapshotRecord]] = defaultdict(list)
    for s in snaps:
        by_session[s.session].append(s)
    victims = []
    for rows in by_session.values():
        rows.sort(key=lambda s: s.id, reverse=True)  # ids sort by creation time
        victims += [s.id for s in rows[max(0, keep_last) :] if _evictable(s, protected) and s.label is None]
    return victims


def ttl_victims(
    sessions: Iterable[SessionInfo], snaps: Iterable[SnapshotRecord], now: float, ttl_s: float, busy: set[str]
) -> list[str]:
    """Unpinned, unlabelled snapshots owned by sessions idle for more than ttl_s, except those a
    session that is not idle still needs."""
    sessions = list(sessions)
    idle = {s.name for s in sessions if now - s.last_used > ttl_s}
    if not idle:
        return []
    needed = busy | {r for s in sessions if s.name not in idle for r in (s.head, s.base) if r}
    return [s.id for s in snaps if s.session in idle and s.label is None and _evictable(s, needed)]


def disk_victims(candidates: Iterable[tuple[str, int]], used: int, need: int, budget: int) -> tuple[list[str], bool]:
    """Victims so that used - freed + need <= budget, taken in order from `candidates`: (id, bytes deleting it
    frees along with those before it), least recently used first (Retention's eviction order). Reads only as
    many candidates as it takes. Returns (victims, whether that is enough)."""
    victims, freed = [], 0
    if used + need <= budget:
        return victims, True
    for sid, nbytes in candidates:
        victims.append(sid)
        freed += nbytes
        if used - freed + need <= budget:
            return victims, True
    return victims, False


def prefix_budget(settings, disk_budget: int) -> int:
    """Bytes prefix states may take: the setting, else a quarter of the disk tier and at most 2 GiB."""
    if settings.prefix_state_bytes is not None:
        return int(settings.prefix_state_bytes)
    return min(disk_budget // 4, PREFIX_DEFAULT_MAX_BYTES)


class Retention:
    def __init__(self, core: StoreCore):
        self._core = core

    # -- the tier plan (tiers/planner.py calls these) -------------------------------------------------
    def follow(self, plan: TierPlan) -> None:
        """Make `plan`'s budgets the store's: hot tiers resized (shrinking ones evict at once), the disk
        budget enforced."""
        c = self._core
        with c.lock:
            if plan.tier("vram").enabled and c.placement.tiers[0].name != "vram":
                # CUDA seen only now (opened before torch was imported): the hottest tier joins, empty
                c.placement.tiers.insert(0, HotTier("vram", 0, plan.tier("vram").device or "cuda"))
            for tier in c.placement.tiers:
                c.placement.set_budget(tier.name, plan.budget(tier.name))
            c.budgets = plan
            self.enforce_disk(GcReport())

    @property
    def plan(self) -> TierPlan | None:
        """The plan followed now (None until a TierPlanner gave one: then nothing can be committed)."""
        return self._core.budgets

    def stored_bytes(self) -> int:
        """Bytes of the snapshot files on disk (the disk rule counts them as usable)."""
        return self._core.index.durable_bytes()[0]

    def usage(self) -> dict[str, tuple[int, int]]:
        """tier name -> (bytes used, snapshot count)."""
        c = self._core
        with c.lock:
            out = {t.name: (0, 0) for t in (c.budgets.tiers if c.budgets else ())}
            out.update(c.placement.usage())
            out["disk"] = c.index.durable_bytes()
            return out

    # -- the rules -----------------------------------------------------------------------------------
    def gc(self) -> GcReport:
        """Apply retention now (keep-last-N, TTL, disk budget) and drop unreachable messages."""
        c = self._core
        report = GcReport()
        with c.lock, c.index.tx():
            c.check_open()
            c.flush_touches()
            busy = c.busy()
            protected = busy | c.index.referenced_ids()
            for sid in keep_last_victims(c.index.snapshots(), c.settings.keep_last, protected):
                report.deleted[sid] = "keep_last"
            ttl = c.settings.session_ttl_s
            if ttl is not None:
                for sid in ttl_victims(c.index.sessions(), c.index.snapshots(), c.clock(), ttl, busy):
                    report.deleted.setdefault(sid, "ttl")
            report.freed_bytes += c.remove(list(report.deleted))
            self.enforce_disk(report)
            for sid in self.keep_prefixes():
                report.deleted[sid] = "prefix_budget"
            report.messages_removed = c.messages.collect()
        return report

    def prefix_budget(self) -> int:
        return prefix_budget(self._core.settings, self._core.disk_budget())

    def keep_prefixes(self) -> list[str]:
        """Evict prefix states, least recently used first, until they fit the prefix budget. Under the lock.
        Returns the ids evicted."""
        c = self._core
        budget = self.prefix_budget()
        evicted: list[str] = []
        c.flush_touches()
        used = c.index.durable_bytes("prefix")[0]
        if used <= budget:
            return evicted
        busy = c.busy()
        for p in sorted(c.index.snapshots(kind="prefix"), key=lambda r: (r.last_access, r.id)):
            if used <= budget:
                break
            if not p.durable or p.id in busy or p.pinned:
                continue
            c.remove([p.id])
            evicted.append(p.id)
            used = c.index.durable_bytes("prefix")[0]
        if evicted:
            log.info("prefix budget %d bytes: evicted %d prefix state(s)", budget, len(evicted))
        return evicted

    def keep_last(self, session: str) -> None:
        """Keep-last-N for one session, after one of its snapshots became durable: what it reads is that session's
        rows and whether they are heads or branch points, never the whole store. Under the lock."""
        c = self._core
        snaps = c.index.snapshots(session)
        if len(snaps) <= c.settings.keep_last:
            return
        protected = c.busy() | c.index.referenced_among(s.id for s in snaps)
        c.remove(keep_last_victims(snaps, c.settings.keep_last, protected))

    def check_disk_room(self, nbytes: int) -> None:
        """Refuse a commit whose write cannot fit on the file system: `nbytes` is what it adds (Snapshots.new_bytes:
        not the KV blocks already stored), counting what the writes already queued add: a full disk then fails
        the turn's snapshot at once, in its result, instead of after the reply (the writer's ENOSPC path,
        Snapshots._abandon, still catches what a racing writer fills or an estimate missed)."""
        c = self._core
        if c.budgets is None:
            raise RuntimeError(
                "the snapshot store follows no tier plan yet: TierPlanner.start(settings, store.retention)"
            )
        free = c.files.free_bytes()
        if free is None:
            return
        queued = sum(c.promised.values())
        need = nbytes + FILE_SLACK_BYTES
        if free - queued < need:
            msg = (
                f"the snapshot could not be saved: the file system of {c.files.snapshots} has "
                f"{free} bytes free ({queued} of them promised to queued writes) and it needs about {need}."
            )
            c.write_errors.append(msg)
            raise DiskFull(msg, hint="free some disk space (or lower keep_last); snapshots resume by themselves")

    def enforce_disk(self, report: GcReport) -> None:
        """Delete the least recently used evictable snapshots and prefix states until the disk budget holds (as
        many as there are, when even all of them are not enough). Under the lock."""
        c = self._core
        c.flush_touches()
        used = c.index.durable_bytes()[0] + c.disk_reserved
        victims, _ = self._disk_victims(used, 0)
        if victims:
            for sid in victims:
                report.deleted[sid] = "disk_budget"
            log.warning("disk budget %d bytes: deleting %d snapshot(s)", c.disk_budget(), len(victims))
            report.freed_bytes += c.remove(victims)

    def make_disk_room(self, need: int) -> bool:
        """Evict within the disk budget so that `need` more bytes fit; False (nothing evicted) when they cannot.
        A write that fits costs two reads of the running totals; one that does not reads the eviction order only
        as far as it must. Under the lock."""
        c = self._core
        used = c.index.durable_bytes()[0] + c.disk_reserved
        if used + need <= c.disk_budget():
            return True
        c.flush_touches()  # the eviction order is by last access
        victims, fits = self._disk_victims(used, need)
        if not fits:
            return False  # not even deleting all of them would make room
        log.info("disk budget: evicting %d snapshot(s) to make room", len(victims))
        c.remove(victims)
        return True

    def _disk_victims(self, used: int, need: int) -> tuple[list[str], bool]:
        """disk_victims over the index's eviction order, each candidate's bytes counted with the blocks it frees
        together with the victims before it (blocks the victims share go when the last of them does)."""
        c = self._core
        busy = c.busy()
        claimed: dict[str, int] = {}

        def candidates() -> Iterator[tuple[str, int]]:
            with contextlib.closing(c.index.eviction_order()) as order:
                for sid, own in order:
                    if sid not in busy:
                        yield sid, own + c.index.freed_along(sid, claimed)

        with c.lock:
            return disk_victims(candidates(), used, need, c.disk_budget())
