"""The sequences of the backend's one llama.cpp context: sequence 0, shared by every conversation (Live),
and up to `kept_max` more that keep states captured on sequence 0's path resident.

The Live that ran last is resident in sequence 0. Running another Live parks the resident one
(llama_state_seq_get_data into a Python bytearray, ~1 ms per 10 MB) and loads the other
(llama_state_seq_set_data), so any number of conversations are held without llama.cpp allocating more.

Kept states. capture() lets sequence k share what sequence 0 holds (llama_memory_seq_cp: its KV cells
and recurrent cell gain a sequence id; no byte moves), so restoring that state later - regenerating a
reply, going back to an earlier turn, a client resending the history - is seq_rm(0) + seq_cp(k -> 0),
again without a copy, however long the conversation. Going on from a shared recurrent cell costs
nothing extra: llama.cpp gathers every recurrent state from its source cell into its destination cell
on each decode anyway (llama-graph.cpp build_rs).

Why only states on sequence 0's path: attention reads every used KV cell up to the highest (masked or
not), and on the CPU a decode over 512+ cells splits them across threads (ggml-cpu flash_attn_ext's
split-KV path), so the bits of a result depend on how many cells are in use, not only on the sequence's
own. A kept state of another conversation would make a live turn differ in its last bits from the same
turn restored in a fresh process. So kept states are always prefixes of one path, whose cells run from
0 without gaps: restoring kept state k drops those longer than k, and loading anything else into
sequence 0 (another conversation, a blob, a new one) drops them all. The context then holds exactly the
cells a fresh process restoring the same state would.

A kept state also goes when the captured state is collected (its tensors' finalizer queues it; the queue
is applied under the backend's lock) and when more than `kept_max` are kept (oldest first).
"""

from __future__ import annotations

import collections
import ctypes
import weakref
from dataclasses import dataclass

from engramctl.engine.backend import Live
from engramctl.engine.llama_lib import take_errors
from engramctl.engine.llama_state import SEQ_ID
from engramctl.errors import EngramError, SnapshotMismatch


class ParkedState:
    """What a Live's `cache` holds here: its state blob while parked (None while resident or empty), and
    the capture serial of a kept state equal to its state (None once it has moved on)."""

    __slots__ = ("blob", "kept")

    def __init__(self, blob: bytearray | None = None, kept: int | None = None):
        self.blob, self.kept = blob, kept


@dataclass
class _Kept:
    seq: int  # llama.cpp sequence id, 1..kept_max
    n_tokens: int
    blob: bytearray  # the captured blob: what a Live parked at this state falls back to once it is dropped


class SequenceSlot:
    def __init__(self, lib, ctx, n_ctx: int, kept_max: int):
        self._lib, self._ctx, self.n_ctx, self.kept_max = lib, ctx, n_ctx, kept_max
        self._mem = lib.llama_get_memory(ctx)
        self._resident: weakref.ref | None = None  # weak: a Live dropped without release() is simply gone
        self._kept: collections.OrderedDict[int, _Kept] = collections.OrderedDict()  # serial -> kept, oldest first
        self._free = list(range(kept_max, 0, -1))
        self.collected: collections.deque[int] = collections.deque()  # serials to drop (finalizers append)
        self.restores: collections.Counter = collections.Counter()  # "kept" | "blob": how hold() loaded a state

    def holds(self, live: Live) -> bool:
        return self._resident is not None and self._resident() is live

    def get_blob(self) -> bytearray:
        """A copy of the resident state, as llama.cpp serializes one sequence."""
        size = self._lib.llama_state_seq_get_size(self._ctx, SEQ_ID)
        blob = bytearray(size)
        written = self._lib.llama_state_seq_get_data(self._ctx, (ctypes.c_uint8 * size).from_buffer(blob), size, SEQ_ID)
        if written != size:
            raise EngramError(f"llama.cpp wrote {written} of {size} state bytes: {take_errors()}")
        return blob

    def last_position(self) -> int:
        """The resident sequence's last position; -1 when the context holds nothing."""
        return int(self._lib.llama_memory_seq_pos_max(self._mem, SEQ_ID))

    @property
    def kept(self) -> int:
        self._apply_collected()
        return len(self._kept)

    # -- kept states ---------------------------------------------------------------------------------
    def keep(self, serial: int, blob: bytearray, n_tokens: int) -> bool:
        """Keep the resident state (whose blob is `blob`) as capture `serial`, if states are kept at all."""
        self._apply_collected()
        if not self.kept_max:
            return False
        if not self._free:
            self._drop(next(iter(self._kept)))
        seq = self._free.pop()
        self._lib.llama_memory_seq_cp(self._mem, SEQ_ID, seq, -1, -1)
        self._kept[serial] = _Kept(seq, n_tokens, blob)
        return True

    def _drop(self, serial: int) -> None:
        kept = self._kept.pop(serial)
        self._lib.llama_memory_seq_rm(self._mem, kept.seq, -1, -1)
        self._free.append(kept.seq)

    def _drop_longer(self, n_tokens: int) -> None:
        for serial in [s for s, k in self._kept.items() if k.n_tokens > n_tokens]:
            self._drop(serial)

    def _apply_collected(self) -> None:
        while self.collected:
            serial = self.collected.popleft()
            if serial in self._kept:
                self._drop(serial)

    # -- sequence 0 ----------------------------------------------------------------------------------
    def hold(self, live: Live) -> None:
        """Make `live`'s state the one in sequence 0, parking whichever Live was there."""
        parked = live.cache
        if not isinstance(parked, ParkedState):
            raise EngramError("this conversation state was released or belongs to another backend.")
        if self.holds(live):
            return
        self._apply_collected()
        current = self._resident() if self._resident is not None else None
        if current is not None and isinstance(current.cache, ParkedState):
            kept = self._kept.get(current.cache.kept)
            current.cache.blob = kept.blob if kept is not None else self.get_blob()
        self._clear()
        kept = self._kept.get(parked.kept)
        if kept is not None:
            self._lib.llama_memory_seq_cp(self._mem, kept.seq, SEQ_ID, -1, -1)
            self._drop_longer(kept.n_tokens)
            self._kept.move_to_end(parked.kept)
            self.restores["kept"] += 1
        else:
            self._drop_longer(-1)  # another path: none of them is a prefix of it
            parked.kept = None
            if parked.blob is not None:
                self._load(parked.blob, len(live.token_ids))
                self.restores["blob"] += 1
        parked.blob = None  # the context has it now; parking it again takes a fresh copy (or the kept one)
        self._resident = weakref.ref(live)

    def release(self, live: Live) -> None:
        if self.holds(live):
            self._clear()
        live.cache = None

    def _load(self, blob: bytearray, n_tokens: int) -> None:
        n = len(blob)
        read = self._lib.llama_state_seq_set_data(self._ctx, (ctypes.c_uint8 * n).from_buffer(blob), n, SEQ_ID)
        if read != n:
            self._clear()
            raise SnapshotMismatch(
                f"llama.cpp refused a state of {n_tokens} tokens "
                f"({take_errors() or 'no reason given'}); the context holds {self.n_ctx}."
            )

    def _clear(self) -> None:
        # Sequence 0 only, metadata only: zeroing buffers would memset the whole KV cache (~5 ms at
        # 512 MiB), and kept states share its cells. Stale bytes are never read: KV cells outside a
        # sequence are masked, and a recurrent cell with no source is zeroed by the graph before use.
        self._lib.llama_memory_seq_rm(self._mem, SEQ_ID, -1, -1)
        self._resident = None
