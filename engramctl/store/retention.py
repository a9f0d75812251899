"""Which snapshots to delete from disk: pure decisions over index records (the store acts on them).

Defaults (Settings): keep_last = 8 per session, session_ttl_s = None (off), disk budget from the tier
plan. The rules, in the order `Store.gc` applies them:

1. keep-last-N: per owning session, the N newest snapshots stay; older ones go unless protected.
2. TTL (optional): a session unused for longer than session_ttl_s loses its unprotected snapshots,
   its own head included; its transcript stays, so it resumes by re-prefilling.
3. disk budget: while the durable bytes exceed the budget, delete the least recently used
   unprotected snapshots, unlabelled ones before labelled ones.

Protected, always: pinned snapshots (never evicted by any rule), snapshots being written or read,
and snapshots another live session depends on (its head or its branch point). Rules 1 and 2 also
keep labelled snapshots; rule 1 keeps every session's head and branch point.
Explicit deletes (Store.delete, Store.delete_session) are the user's decision, not retention.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from engramctl.store.records import SessionInfo, SnapshotRecord


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


def disk_victims(
    snaps: Iterable[SnapshotRecord], used: int, need: int, budget: int, protected: set[str]
) -> tuple[list[str], bool]:
    """Snapshots to delete so that used - freed + need <= budget, least recently used first,
    unlabelled before labelled. Returns (victims, whether that is enough)."""
    if used + need <= budget:
        return [], True
    order = sorted(
        (s for s in snaps if _evictable(s, protected)),
        key=lambda s: (s.label is not None, s.last_access, s.id),
    )
    victims, freed = [], 0
    for s in order:
        if used - freed + need <= budget:
            break
        victims.append(s.id)
        freed += s.nbytes
    return victims, used - freed + need <= budget
