"""Host buffers for the llama.cpp state blobs a restore reads from disk (llama_place.place), reused.

A restore's floor is a read into memory already in place; a fresh buffer first has every page faulted in and
zeroed by the kernel, and numpy's huge pages may compact memory for it: 50 ms of a 130 ms restore of 47 MB of
SmolLM2 KV (scripts/bench_restore.py). So a blob's memory goes back to a pool once nothing refers to it (the
memory tier dropped its payload, the Live that loaded it was released) and the next restore of a similar size
takes it, already faulted in.

A buffer is free when the pool holds the only reference to it: every array a restore hands out (the payload's
tensors, the blob, a Live's parked blob) is a numpy view whose `base` is the buffer, so CPython's reference
count says exactly when the last one went. Free buffers beyond `keep` are let go (the largest first), so the
pool holds at most `keep` buffers nobody uses, on top of the memory tiers' budgets.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

# sys.getrefcount of a buffer nobody else holds, as free() counts: the pool's list, the loop variable, the call
_FREE_REFS = 3
_FIT = 1.5  # a free buffer serves a request of at least 1/_FIT of its size: a reused one wastes at most a third


class HostBuffers:
    def __init__(self, keep: int = 2):
        self.keep = keep
        self._lock = threading.Lock()
        self._owned: list[np.ndarray] = []
        self.reused = 0  # takes served by a free buffer
        self.fresh = 0  # ... by a new one

    def take(self, nbytes: int) -> np.ndarray:
        """A writable uint8 buffer of at least `nbytes` (use its first nbytes; views of it keep it taken)."""
        with self._lock:
            free = self._free()
            fits = [b for b in free if nbytes <= b.nbytes <= nbytes * _FIT + 4096]
            if fits:
                self.reused += 1
                return min(fits, key=lambda b: b.nbytes)
            for b in sorted(free, key=lambda b: -b.nbytes)[: max(0, len(free) - self.keep)]:
                self._drop(b)  # room for the new one within `keep` free buffers later
            del free, fits
            buf = np.empty(nbytes, np.uint8)
            self._owned.append(buf)
            self.fresh += 1
            return buf

    def _free(self) -> list[np.ndarray]:
        out = []
        for b in self._owned:
            if sys.getrefcount(b) <= _FREE_REFS:
                out.append(b)
        return out

    def _drop(self, buf: np.ndarray) -> None:
        self._owned = [b for b in self._owned if b is not buf]

    def free_count(self) -> int:
        """Buffers nobody refers to now (kept for the next take)."""
        with self._lock:
            return len(self._free())

    def held_bytes(self) -> int:
        """Bytes of every buffer the pool owns, taken or free."""
        with self._lock:
            return sum(b.nbytes for b in self._owned)


def _refcount_baseline() -> int:
    """What _free counts for a buffer only the pool holds, measured once: CPython's count differs between versions."""
    probe = HostBuffers()
    probe._owned.append(np.empty(1, np.uint8))
    for b in probe._owned:
        return sys.getrefcount(b)
    return _FREE_REFS


_FREE_REFS = _refcount_baseline()
