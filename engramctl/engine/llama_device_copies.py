"""The llama.cpp backend's VRAM tier: copies of parked conversations' states kept in device memory the context
owns (LLAMA_STATE_SEQ_FLAGS_ON_DEVICE), so that resuming one is a device-to-device copy instead of a host-to-device
copy of its blob. On the CPU build the same calls copy within host memory (how it is tested without a GPU).

Why ON_DEVICE copies and not resident sequences (parked conversations left in sequences of the context):
- exactness: a turn that runs alone must see only its own cells from cell 0 (llama_pool.py invariant 2); resident
  parked cells in the one KV cache would have to be parked to the host for every such turn, which is every turn
  of a home lab's one user. A copy lives outside the KV cache: restoring it lays the cells out exactly as loading
  the blob does (bitwise the same continuation, tests/engine/test_llama_device_copies.py);
- cost per step: cells of resident sequences widen the KV range every step's attention reads; copies are not read;
- size: a copy holds the tokens the conversation has; a resident sequence needs its cells in a KV cache sized
  up front.
A copy still costs a recurrent cell of its own in the context (below), so a copy of a hybrid's state costs its
recurrent state twice; the measured figures on a GPU are for docs/gpu.md.

What llama.cpp offers, and the rules that follow (vendored llama.cpp 0.3.36, src/llama-context.cpp):
- one copy per *source* sequence id: a save from sequence s replaces the copy s held, and restoring a metadata blob
  whose copy was replaced either aborts the process (another size: "memory buffer mismatch") or silently loads the
  other state (the same size). So each copy is saved from a slot: a sequence id of its own (`first`..), which the
  state is copied into (llama_memory_seq_cp: cells gain the id, a recurrent cell is shared, no bytes move), saved
  from, and removed from again; and a copy is loaded only while its slot still holds it (`_owner`, generations).
- a save aborts the process when the sequence's KV cells are not one contiguous range: only a state whose cells
  run from cell 0 without gaps (the pool's packed Live) or a model without KV is saved (the caller's check).
- a load into a KV cache with no free range long enough fails cleanly (llama.cpp logs "failed to find N
  available cells", returns 0; the copy stays valid), as a blob's does; checked in a child process, since a newer
  llama.cpp asserts in its device reader's destructor there (tests/engine/test_llama_device_copies.py).
- the context keeps a slot's device buffer until the slot saves a state of another size (then it frees it and
  allocates the new one); so the bytes held are every used slot's last size, and the budget counts them.
- each slot id is a sequence the context was created with (n_seq_max): one recurrent cell each, allocated up front.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import weakref
from dataclasses import dataclass

from engramctl.engine.llama_lib import take_errors


@dataclass(frozen=True)
class DeviceCopy:
    """A state's copy in slot `slot`, valid while the slot's generation is still `generation`."""

    slot: int
    generation: int
    meta: bytearray  # what llama.cpp wrote to the host: the cells' metadata, no tensor bytes
    size_bytes: int  # the device bytes it holds (the host blob's size less the metadata)


class DeviceCopies:
    def __init__(self, lib, ctx, first: int, slots: int, budget_bytes: int):
        self._lib, self._ctx, self._mem = lib, ctx, lib.llama_get_memory(ctx)
        self.flags = lib.LLAMA_STATE_SEQ_FLAGS_ON_DEVICE
        self.first, self.slots, self.budget_bytes = first, slots, int(budget_bytes)
        self._size = [0] * slots  # each slot's device buffer as llama.cpp keeps it (0: never allocated)
        self._owner: list[int | None] = [None] * slots  # the generation of the copy a slot holds (None: free)
        # who holds each slot's copy (a ParkedState): a slot whose holder was collected without drop() is free
        self._holder: list[weakref.ref | None] = [None] * slots
        self._lru: collections.OrderedDict[int, None] = collections.OrderedDict()  # held slots, oldest first
        self._generations = itertools.count(1)
        self.restores = 0

    @property
    def used_bytes(self) -> int:
        """Device bytes the copies' buffers take, held or lingering in free slots (llama.cpp keeps them)."""
        return sum(self._size)

    @property
    def held(self) -> int:
        self._reap()
        return len(self._lru)

    def valid(self, copy: DeviceCopy | None) -> bool:
        return copy is not None and self._owner[copy.slot] == copy.generation

    def save(self, seq: int, size_bytes: int, owner: object) -> DeviceCopy | None:
        """Copy what sequence `seq` holds (`size_bytes` on the device, the caller's estimate from its host blob)
        into a slot, evicting the least recently used copies to fit the budget; None when it cannot fit. The
        slot is free again once `owner` is collected, if nobody dropped the copy before."""
        self._reap()
        slot = self._room(size_bytes)
        if slot is None:
            return None
        sid = self.first + slot
        lib = self._lib
        lib.llama_memory_seq_rm(self._mem, sid, -1, -1)
        lib.llama_memory_seq_cp(self._mem, seq, sid, -1, -1)
        try:
            n = lib.llama_state_seq_get_size_ext(self._ctx, sid, self.flags)
            meta = bytearray(n)
            written = lib.llama_state_seq_get_data_ext(
                self._ctx, (ctypes.c_uint8 * n).from_buffer(meta), n, sid, self.flags
            )
        finally:
            lib.llama_memory_seq_rm(self._mem, sid, -1, -1)
        self._size[slot] = size_bytes
        if not n or written != n:  # the slot's buffer is in an unknown state: nothing may load from it
            self._owner[slot] = None
            take_errors()
            return None
        generation = next(self._generations)
        self._owner[slot], self._holder[slot] = generation, weakref.ref(owner)
        self._lru[slot] = None
        return DeviceCopy(slot, generation, meta, size_bytes)

    def load(self, copy: DeviceCopy, seq: int) -> bool:
        """Restore `copy` into the empty sequence `seq`; False (nothing loaded) when its slot no longer holds it
        or llama.cpp refused it."""
        if not self.valid(copy):
            return False
        n = len(copy.meta)
        read = self._lib.llama_state_seq_set_data_ext(
            self._ctx, (ctypes.c_uint8 * n).from_buffer(copy.meta), n, seq, self.flags
        )
        if read != n:
            self._lib.llama_memory_seq_rm(self._mem, seq, -1, -1)
            take_errors()
            return False
        self._lru.move_to_end(copy.slot)
        self.restores += 1
        return True

    def drop(self, copy: DeviceCopy | None) -> None:
        """The copy is no longer wanted (its conversation moved on or was released): its slot is free."""
        if self.valid(copy):
            self._free(copy.slot)

    def _reap(self) -> None:
        for slot in [s for s in self._lru if self._holder[s]() is None]:
            self._free(slot)

    def _free(self, slot: int) -> None:
        self._owner[slot] = self._holder[slot] = None
        self._lru.pop(slot, None)

    def _room(self, size_bytes: int) -> int | None:
        """A free slot whose buffer, resized to `size_bytes`, keeps every buffer within the budget, evicting
        the oldest copies until one does; a slot already of that size first (no reallocation)."""
        if size_bytes > self.budget_bytes:
            return None
        while True:
            free = [s for s in range(self.slots) if self._owner[s] is None]
            fits = [s for s in free if self.used_bytes - self._size[s] + size_bytes <= self.budget_bytes]
            if fits:
                return min(fits, key=lambda s: (self._size[s] != size_bytes, -self._size[s]))
            if not self._lru:
                return None
            self._free(next(iter(self._lru)))  # its conversation falls back to its host blob
