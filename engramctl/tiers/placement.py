"""Hot copies across the memory tiers (VRAM, RAM), least-recently-used by bytes.

The tiers are exclusive: a key is in at most one memory tier (the disk copy is separate and always
there once durable). Every entry carries an access stamp; together the tiers form one LRU list:
- `put` inserts into the hottest tier where it fits, evicting older entries first (never after: a
  budget is never exceeded, not even for a moment). An entry larger than a tier's budget skips it.
- an entry evicted from a tier is demoted to the next colder one if it is newer than what it would
  displace there, else dropped (the disk copy remains).
- `promote` moves an entry to the hottest tier with room (used when a snapshot is restored).
- held keys (being restored or written) are never evicted by `put`/`promote`.
Values are opaque; `move(value, device)` puts one on a tier's device (tensors to "cuda" or "cpu").
Not thread-safe: the store calls it under its lock.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence


@dataclass
class _Entry:
    value: Any
    nbytes: int
    stamp: int


class HotTier:
    def __init__(self, name: str, budget: int, device: str):
        self.name, self.budget, self.device = name, int(budget), device
        self.entries: dict[str, _Entry] = {}
        self.used = 0

    def __repr__(self) -> str:
        return f"HotTier({self.name!r}, used={self.used}/{self.budget}, n={len(self.entries)})"


class Placement:
    def __init__(self, tiers: Sequence[HotTier], move: Callable[[Any, str], Any] | None = None):
        self.tiers = list(tiers)  # hottest first
        self._move = move or (lambda value, device: value)
        self._held: Counter[str] = Counter()
        self._clock = itertools.count(1)

    # -- holds ---------------------------------------------------------------------------------------
    def hold(self, key: str) -> None:
        self._held[key] += 1

    def release(self, key: str) -> None:
        self._held[key] -= 1
        if self._held[key] <= 0:
            del self._held[key]

    def held(self, key: str) -> bool:
        return self._held[key] > 0

    # -- lookups -------------------------------------------------------------------------------------
    def _find(self, key: str) -> int | None:
        for i, tier in enumerate(self.tiers):
            if key in tier.entries:
                return i
        return None

    def where(self, key: str) -> str | None:
        i = self._find(key)
        return None if i is None else self.tiers[i].name

    def get(self, key: str, touch: bool = True) -> tuple[Any, str] | None:
        i = self._find(key)
        if i is None:
            return None
        entry = self.tiers[i].entries[key]
        if touch:
            entry.stamp = next(self._clock)
        return entry.value, self.tiers[i].name

    def lru(self, name: str) -> list[str]:
        """Keys of a tier, least recently used first."""
        tier = self._tier(name)
        return [k for k, _ in sorted(tier.entries.items(), key=lambda kv: kv[1].stamp)]

    def usage(self) -> dict[str, tuple[int, int]]:
        return {t.name: (t.used, len(t.entries)) for t in self.tiers}

    # -- changes -------------------------------------------------------------------------------------
    def put(self, key: str, value: Any, nbytes: int) -> str | None:
        """Insert as most recently used into the hottest tier with room; returns its tier or None."""
        if self._find(key) is not None:
            self.get(key)
            return self.where(key)
        return self._insert(0, key, value, nbytes, next(self._clock))

    def promote(self, key: str) -> str | None:
        """Move to the hottest tier with room (and mark used); returns the tier it is in now."""
        i = self._find(key)
        if i is None:
            return None
        entry = self.tiers[i].entries[key]
        entry.stamp = next(self._clock)
        # Out of its tier first: what the hotter tier demotes may take the slot it leaves (a swap),
        # instead of being dropped for want of room. _make_room changes nothing when it fails, so
        # if no hotter tier has room the slot is still free to put it back.
        self._remove(i, key)
        for j in range(i):
            if self._make_room(j, entry.nbytes, entry.stamp):
                self._place(j, key, entry.value, entry.nbytes, entry.stamp)
                return self.tiers[j].name
        self._place(i, key, entry.value, entry.nbytes, entry.stamp)
        return self.tiers[i].name

    def drop(self, key: str) -> bool:
        i = self._find(key)
        if i is None:
            return False
        self._remove(i, key)
        return True

    def set_budget(self, name: str, budget: int) -> None:
        """Change a budget, evicting (oldest first, held entries last) until the tier fits it."""
        idx = self.tiers.index(self._tier(name))
        tier = self.tiers[idx]
        tier.budget = int(budget)
        order = sorted(tier.entries.items(), key=lambda kv: (self.held(kv[0]), kv[1].stamp))
        for key, entry in order:
            if tier.used <= tier.budget:
                break
            self._remove(idx, key)
            self._insert(idx + 1, key, entry.value, entry.nbytes, entry.stamp)

    # -- internals -----------------------------------------------------------------------------------
    def _tier(self, name: str) -> HotTier:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)

    def _insert(self, start: int, key: str, value: Any, nbytes: int, stamp: int) -> str | None:
        for j in range(start, len(self.tiers)):
            if self._make_room(j, nbytes, stamp):
                self._place(j, key, value, nbytes, stamp)
                return self.tiers[j].name
        return None

    def _make_room(self, idx: int, nbytes: int, stamp: int) -> bool:
        """Evict entries older than `stamp` (not held) from tier idx until nbytes fit; all or nothing."""
        tier = self.tiers[idx]
        if nbytes > tier.budget:
            return False
        victims = sorted(
            ((k, e) for k, e in tier.entries.items() if e.stamp < stamp and not self.held(k)),
            key=lambda kv: kv[1].stamp,
        )
        if tier.used - sum(e.nbytes for _, e in victims) + nbytes > tier.budget:
            return False
        for key, entry in victims:
            if tier.used + nbytes <= tier.budget:
                break
            self._remove(idx, key)
            self._insert(idx + 1, key, entry.value, entry.nbytes, entry.stamp)  # demote or drop
        return True

    def _place(self, idx: int, key: str, value: Any, nbytes: int, stamp: int) -> None:
        tier = self.tiers[idx]
        assert tier.used + nbytes <= tier.budget
        tier.entries[key] = _Entry(self._move(value, tier.device), nbytes, stamp)
        tier.used += nbytes

    def _remove(self, idx: int, key: str) -> None:
        tier = self.tiers[idx]
        entry = tier.entries.pop(key)
        tier.used -= entry.nbytes
