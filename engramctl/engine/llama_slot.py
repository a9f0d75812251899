"""The one sequence of a llama.cpp context, shared by every conversation (Live) of the backend.

The Live that ran last is resident: its state is in llama.cpp. Running another Live parks the resident
one (llama_state_seq_get_data into a Python bytearray, ~1 ms per 10 MB) and loads the other
(llama_state_seq_set_data). llama.cpp thus holds one sequence however many conversations are kept, a
parked one is plain Python memory that goes with its Live, and an older Live can always go on.
"""

from __future__ import annotations

import ctypes
import weakref

from engramctl.engine.backend import Live
from engramctl.engine.llama_lib import take_errors
from engramctl.engine.llama_state import SEQ_ID
from engramctl.errors import EngramError, SnapshotMismatch


class ParkedState:
    """What a Live's `cache` holds here: its state blob while parked; None while resident or empty."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytearray | None = None):
        self.blob = blob


class SequenceSlot:
    def __init__(self, lib, ctx, n_ctx: int):
        self._lib, self._ctx, self.n_ctx = lib, ctx, n_ctx
        self._mem = lib.llama_get_memory(ctx)
        self._resident: weakref.ref | None = None  # weak: a Live dropped without release() is simply gone

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

    def hold(self, live: Live) -> None:
        """Make `live`'s state the one in the context, parking whichever Live was there."""
        parked = live.cache
        if not isinstance(parked, ParkedState):
            raise EngramError("this conversation state was released or belongs to another backend.")
        if self.holds(live):
            return
        current = self._resident() if self._resident is not None else None
        if current is not None and isinstance(current.cache, ParkedState):
            current.cache.blob = self.get_blob()
        self._clear()
        if parked.blob is not None:
            n = len(parked.blob)
            read = self._lib.llama_state_seq_set_data(
                self._ctx, (ctypes.c_uint8 * n).from_buffer(parked.blob), n, SEQ_ID
            )
            if read != n:
                self._clear()
                raise SnapshotMismatch(
                    f"llama.cpp refused a state of {len(live.token_ids)} tokens "
                    f"({take_errors() or 'no reason given'}); the context holds {self.n_ctx}."
                )
            parked.blob = None  # the context has it now; parking it again takes a fresh copy
        self._resident = weakref.ref(live)

    def release(self, live: Live) -> None:
        if self.holds(live):
            self._clear()
        live.cache = None

    def _clear(self) -> None:
        # Metadata only: zeroing the buffers (data=True) memsets the whole KV cache, ~5 ms per swap at a
        # 512 MiB cache. Stale bytes are never read: KV cells past the sequence are masked, and a
        # recurrent cell with no source is zeroed by the graph before its first use.
        self._lib.llama_memory_clear(self._mem, False)
        self._resident = None
