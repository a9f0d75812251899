"""Host buffers for the llama.cpp state blobs a restore reads from disk (llama_place.place) and a capture copies
out of the context (llama_pool.get_blob), reused.

A restore's floor is a read into memory already in place; a fresh buffer first has every page faulted in and
zeroed by the kernel, and numpy's huge pages may compact memory for it: 50 ms of a 130 ms restore of 47 MB of
SmolLM2 KV (scripts/bench_restore.py). So a blob's memory goes back to a pool once nothing refers to it (the
memory tier dropped its payload, the Live that loaded it was released) and the next restore of a similar size
takes it, already faulted in.

A capture is on the turn loop (between two steps), and a capture into fresh memory pays those faults there (~30-60
ms for the 31 MB of the 350M preset at 2K tokens, against ~8 ms for the copy itself); captures grow as a prompt
goes on (a prefix state every 2,048 tokens) and the memory tiers hold them, so there is seldom a free one to
reuse. So after each capture a buffer for the next one (`ahead` times its size: the next interval's state fits)
is allocated and faulted in on a background thread (`prepare`), beside the next step.

A buffer is free when the pool holds the only reference to it: every array a restore hands out (the payload's
tensors, the blob, a Live's parked blob) is a numpy view whose `base` is the buffer, so CPython's reference
count says exactly when the last one went. Free buffers beyond `keep` are let go (the largest first), so the
pool holds at most `keep` buffers nobody uses, on top of the memory tiers' budgets.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading

import numpy as np

from engramctl.store.threads import Workers

# sys.getrefcount of a buffer nobody else holds, as free() counts: the pool's list, the loop variable, the call
_FREE_REFS = 3
_FIT = 1.5  # a free buffer serves a request of at least 1/_FIT of its size: a reused one wastes at most a third
_PAGE = 4096
# the next capture's size, as a multiple of the last one's: a prompt's state 2,048 tokens later (its next prefix state)
# is 1.26x at 2K tokens on the 350M preset (31 -> 39 MB) and less after; a take of n uses a buffer of up to 1.5n
AHEAD = 1.4


_preparer = Workers(1, "engram-buffers")  # the one thread of this process that faults buffers in ahead of their use


class HostBuffers:
    def __init__(self, keep: int = 2):
        _preparer()  # its thread starts with the first pool, not inside a turn
        self.keep = keep
        self._lock = threading.Lock()
        self._owned: list[np.ndarray] = []
        self.reused = 0  # takes served by a free buffer
        self.fresh = 0  # ... by a new one
        self.prepared = 0  # buffers faulted in ahead of a take (prepare)
        self._preparing = False

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

    def prepare(self, nbytes: int) -> concurrent.futures.Future | None:
        """Make sure a free buffer that take(nbytes) would use exists, faulting a new one in on a background
        thread when none does (None: one already does, or is being made)."""
        with self._lock:
            if self._preparing or any(nbytes <= b.nbytes <= nbytes * _FIT + 4096 for b in self._free()):
                return None
            self._preparing = True
        return _preparer().submit(self._prepare, nbytes)

    def _prepare(self, nbytes: int) -> None:
        try:
            buf = np.empty(nbytes, np.uint8)
            buf[::_PAGE] = 0  # a write per page faults each one in, here rather than in the next capture's copy
            with self._lock:
                free = self._free()
                for b in sorted(free, key=lambda b: -b.nbytes)[: max(0, len(free) + 1 - self.keep)]:
                    self._drop(b)  # within `keep` free buffers with this one
                del free
                self._owned.append(buf)
                self.prepared += 1
        finally:
            with self._lock:
                self._preparing = False

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
