"""The sequences of the backend's one llama.cpp context: `sequences` that conversations (Lives) run in,
stepped together in one llama_decode, and up to `kept_max` more that keep captured states resident. Why each
rule below holds, with what was measured: docs/history/llama-pool.md.

Invariants:
1. Residency. A Live holds a sequence (`cache.seq`) while resident; parked, its state is a blob in its
   ParkedState (none if it consumed nothing). Any number of Lives are held without llama.cpp allocating more:
   the least recently stepped Live not in the current step is parked to make room (`seat`). A released Live
   frees its sequence at once.
2. Solo exactness. A step of ONE Live (`solo`) computes what a fresh process restoring the same state computes:
   the context then holds that Live's cells alone, in sequence 0, on one path from cell 0 without gaps, with
   nothing else but kept states that are prefixes of that path (other residents parked; a Live interleaved by a
   batch re-packed from its blob). A step of several Lives may differ from their solo runs in the last bits.
3. Packed. `_packed` names the Live whose cells already run from cell 0 with nothing placed after them since
   (loaded alone, or from a kept state); solo() of it parks the others only.
4. Kept states are prefixes of one path whose cells run from 0 without gaps: only a packed Live's state is kept
   (`keep`: its cells gain a sequence id, no byte moves); restoring kept state k alone drops those longer than
   k; loading anything else alone drops them all; a kept state goes when its captured state is collected (the
   finalizer queues it, applied under the backend's lock) or when more than `kept_max` are kept, oldest first.
5. Provenance (`remember`, `original`). A captured state is views of one blob that nothing modifies. While its
   tensors are still those views, restoring it loads that blob (one copy) or copies its kept sequence (none);
   any other state is serialized again first (two copies). Parking a Live unchanged since its capture takes the
   captured blob instead of a copy.
6. Shared prefixes (`share`). A new conversation whose prompt begins as a resident one's starts from a copy of
   that one's cells for the common part, nothing computed: only under load (the scheduler asks when other turns
   run; a turn alone computes its whole prompt) and only on attention-only models.
7. A stream per sequence (attention-only models, llama_streams.py): a sequence's cells are a stream of their
   own from cell 0, and a step reads only its sequences' streams; so solo() only seats the Live, a shared
   prefix is copied into the new stream, blobs are converted to and from the one-stream form, and no states
   are kept (kept_max 0) nor copied to the device.
8. Device copies (the VRAM tier, llama_device_copies.py): a Live parked while packed (or on a model without KV,
   whose state is one recurrent cell) also leaves a copy of its state in device memory, and loading it later
   takes that copy (a device-to-device copy) before its blob (host to device). The blob stays: a copy the budget
   evicts, or one that no longer holds, falls back to it. A Live that steps drops its copy (no longer its state).
   Where a state comes from on loading: a kept sequence (no copy), else its device copy, else its blob.
"""

from __future__ import annotations

import collections
import ctypes
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engramctl.engine import llama_state
from engramctl.engine.backend import Live
from engramctl.engine.llama_context import ContextSize
from engramctl.engine.llama_device_copies import DeviceCopies, DeviceCopy
from engramctl.engine.llama_lib import take_errors
from engramctl.engine.llama_origins import Origins
from engramctl.engine.llama_state import SEQ_ID, renumber
from engramctl.engine.llama_streams import as_streams, of_streams, one_stream, one_stream_again
from engramctl.errors import EngramError, SnapshotMismatch
from engramctl.state import SessionState


class ParkedState:
    """What a Live's `cache` holds here: its sequence while resident (None while parked), its state blob
    while parked (None while resident or empty), the capture serial of a kept state equal to its state,
    the blob of the last capture while it is still its state and its device copy while that is its state
    (the last three None once it has moved on)."""

    __slots__ = ("__weakref__", "blob", "captured", "device", "kept", "loaded", "seq")

    def __init__(self, blob: bytearray | None = None, kept: int | None = None):
        self.seq: int | None = None
        self.blob, self.kept = blob, kept
        self.captured: bytearray | None = None
        self.device: DeviceCopy | None = None
        # ("device" | "blob" of the first load, ms of every load) since take_load last asked: what resuming
        # a parked conversation cost inside the steps that loaded it
        self.loaded: tuple[str, float] | None = None


@dataclass
class _Kept:
    seq: int  # llama.cpp sequence id, sequences..sequences + kept_max - 1
    n_tokens: int
    blob: bytearray  # the captured blob: what a Live parked at this state falls back to once it is dropped


class SequencePool:
    def __init__(self, lib, ctx, size: ContextSize, has_kv: bool):
        self._lib, self._ctx, self.n_ctx, self.has_kv = lib, ctx, size.n_ctx, has_kv
        self.sequences, self.kept_max = size.sequences, size.kept_max
        self.streams = size.streams  # a KV stream per sequence (llama_streams.py): no kept states then
        self.n_seq = size.n_seq_max  # one recurrent cell each, or one KV stream each
        self._mem = lib.llama_get_memory(ctx)
        # seq -> the Live resident there, least recently stepped first; weak: a Live dropped without
        # release() is simply gone (its sequence is reclaimed on the next look)
        self._seated: collections.OrderedDict[int, weakref.ref] = collections.OrderedDict()
        self._free_seqs = list(range(self.sequences - 1, -1, -1))  # pop() gives sequence 0 first
        self._packed: weakref.ref | None = None
        self._kept: collections.OrderedDict[int, _Kept] = collections.OrderedDict()  # serial -> kept, oldest first
        self._free_kept = list(range(self.sequences + self.kept_max - 1, self.sequences - 1, -1))
        first_slot = self.sequences + self.kept_max
        self.device = (
            DeviceCopies(lib, ctx, first_slot, size.device_slots, size.device_bytes) if size.device_slots else None
        )
        self.collected: collections.deque[int] = collections.deque()  # serials to drop (finalizers append)
        self.origins = Origins(self.collected)  # the blobs captured and placed states are views of (remember)
        self.restores: collections.Counter = collections.Counter()  # "kept" | "blob": how a state was loaded
        self.shares = 0  # prompts that started from another conversation's cells (share)
        # with streams, a restore's blob is rewritten for set_data (of_streams) into this buffer, kept: it holds the
        # largest state restored so far (at most one stream's KV), already in memory for the next restore
        self._streams_buffer = bytearray()

    # -- looking -------------------------------------------------------------------------------------
    def holds(self, live: Live) -> bool:
        return isinstance(live.cache, ParkedState) and live.cache.seq is not None

    def residents(self) -> list[Live]:
        self._reap()
        return [ref() for ref in self._seated.values()]

    def get_blob(self, seq: int = SEQ_ID, take: Callable[[int], np.ndarray] | None = None) -> bytearray:
        """A copy of what sequence `seq` holds, as llama.cpp serializes one sequence, renumbered to SEQ_ID: into
        `take(size)`'s memory (llama_buffers.HostBuffers: reused, already faulted in) where given and the context
        has one KV stream (one_stream cuts a bytearray), else into a new bytearray."""
        size = self._lib.llama_state_seq_get_size(self._ctx, seq)
        blob = take(size)[:size] if take is not None and not self.streams else bytearray(size)
        written = self._lib.llama_state_seq_get_data(self._ctx, (ctypes.c_uint8 * size).from_buffer(blob), size, seq)
        if written != size:
            raise EngramError(f"llama.cpp wrote {written} of {size} state bytes: {take_errors()}")
        return renumber(one_stream(blob) if self.streams else blob, self.has_kv)

    def last_position(self, seq: int = SEQ_ID) -> int:
        """Sequence `seq`'s last position; -1 when it holds nothing."""
        return int(self._lib.llama_memory_seq_pos_max(self._mem, seq))

    @property
    def kept(self) -> int:
        self._apply_collected()
        return len(self._kept)

    def _is_packed(self, live: Live) -> bool:
        return self._packed is not None and self._packed() is live and self.holds(live)

    # -- kept states ---------------------------------------------------------------------------------
    def keep(self, live: Live, serial: int, blob: bytearray, n_tokens: int) -> bool:
        """Keep `live`'s resident state (whose blob is `blob`) as capture `serial`, if states are kept at
        all and its cells are the one path kept states are prefixes of."""
        self._apply_collected()
        if not self.kept_max or not self._is_packed(live):
            return False
        if not self._free_kept:
            self._drop(next(iter(self._kept)))
        seq = self._free_kept.pop()
        self._lib.llama_memory_seq_cp(self._mem, live.cache.seq, seq, -1, -1)
        self._kept[serial] = _Kept(seq, n_tokens, blob)
        live.cache.kept = serial
        return True

    def _drop(self, serial: int) -> None:
        kept = self._kept.pop(serial)
        self._lib.llama_memory_seq_rm(self._mem, kept.seq, -1, -1)
        self._free_kept.append(kept.seq)

    def _drop_longer(self, n_tokens: int) -> None:
        for serial in [s for s, k in self._kept.items() if k.n_tokens > n_tokens]:
            self._drop(serial)

    def _apply_collected(self) -> None:
        while self.collected:
            serial = self.collected.popleft()
            if serial in self._kept:
                self._drop(serial)

    # -- residency -----------------------------------------------------------------------------------
    def solo(self, live: Live) -> None:
        """Make the context hold what a fresh process restoring `live`'s state would: `live` in sequence
        0, alone but for kept states on its path. With a stream per sequence its stream already is that (its
        own cells from cell 0, and a step of it alone reads no other stream's): it only needs to be resident."""
        if self.streams:
            self.seat([live])
            return
        parked = _cache(live)
        self._apply_collected()
        if self._is_packed(live) and parked.seq == SEQ_ID and len(self._seated) == 1:
            return
        packed = self._is_packed(live)
        for other in self.residents():
            if other is not live and other is not None:
                self._park(other)
        if packed:  # its cells already run from 0: only what lies beyond them goes
            self._drop_longer(len(live.token_ids))
            if parked.seq != SEQ_ID:  # no copy: sequence 0 gains its cells, then the old id lets go
                old = parked.seq
                self._lib.llama_memory_seq_cp(self._mem, old, SEQ_ID, -1, -1)
                self._lib.llama_memory_seq_rm(self._mem, old, -1, -1)
                self._unseat(old)
                self._seat(live, self._take_seq(SEQ_ID))
                self._packed = weakref.ref(live)
            return
        if parked.seq is not None:
            self._park(live)  # its cells are interleaved with others': re-packed from its blob
        kept = self._kept.get(parked.kept)
        seq = self._take_seq(SEQ_ID)
        if kept is not None:
            self._lib.llama_memory_seq_cp(self._mem, kept.seq, seq, -1, -1)
            self._drop_longer(kept.n_tokens)
            self._kept.move_to_end(parked.kept)
            self.restores["kept"] += 1
        else:
            self._drop_longer(-1)  # another path: none of them is a prefix of it
            parked.kept = None
            self._load_parked(live, seq)
        parked.blob = None  # the context has it now; parking it again takes a fresh copy (or the kept one)
        self._seat(live, seq)
        self._packed = weakref.ref(live)

    def admit(self, live: Live) -> None:
        """Load `live` now (a restore's cost is paid here): alone, as solo() does, when no other Live is
        resident; else into a sequence of its own beside them."""
        if not self.residents():
            self.solo(live)
            return
        self.seat([live])
        if live.cache.kept is not None and live.cache.kept in self._kept:
            self._packed = weakref.ref(live)  # a kept state's cells: a path from cell 0, nothing after it yet

    def seat(self, lives: Sequence[Live]) -> None:
        """Give each of `lives` (at most `sequences`) a sequence for a step they share, parking the least
        recently stepped other Lives to make room."""
        self._apply_collected()
        self._reap()
        for live in lives:
            parked = _cache(live)
            if parked.seq is None:
                seq = self._free_seqs.pop() if self._free_seqs else self._evict(lives)
                kept = self._kept.get(parked.kept)
                if kept is not None:
                    self._lib.llama_memory_seq_cp(self._mem, kept.seq, seq, -1, -1)
                    self.restores["kept"] += 1
                else:
                    self._load_parked(live, seq)
                parked.blob = None
                self._seat(live, seq)
                if live.token_ids:
                    self._packed = None  # cells placed after the packed Live's
            self._seated.move_to_end(parked.seq)

    def share(self, live: Live, ids: Sequence[int], min_tokens: int, layout: llama_state.BlobLayout) -> int:
        """Give `live` (which holds nothing) the longest prefix of `ids` that a resident conversation holds, if
        at least `min_tokens`: that one's KV cells for it are copied into `live`'s stream (~1 ms per 10 MB;
        another stream's cells cannot gain its sequence id: a partial llama_memory_seq_cp across streams aborts)
        and nothing is computed. Attention-only models with a stream per sequence only (the caller's check): a
        recurrent state cannot be cut back to a prefix. Returns the tokens shared (0: none)."""
        n_best, best = self._best_prefix(live, ids)
        if best is None or n_best < min_tokens:
            return 0
        self.seat([live, best])  # a sequence for `live`, never by parking the one it shares with
        n = len(best.token_ids)
        src = best.cache.captured or llama_state.in_position_order(self.get_blob(best.cache.seq), layout, n)
        self._load(llama_state.prefix(src, layout, n, n_best), n_best, live.cache.seq)
        live.token_ids.extend(ids[:n_best])
        self.shares += 1
        return n_best

    def shareable(self, live: Live, ids: Sequence[int], min_tokens: int) -> int:
        """The tokens `share` would give `live` now (0: none), nothing moved."""
        n_best, best = self._best_prefix(live, ids)
        return n_best if best is not None and n_best >= min_tokens else 0

    def _best_prefix(self, live: Live, ids: Sequence[int]) -> tuple[int, Live | None]:
        """The resident conversation sharing the longest prefix with `ids`, and that prefix's length."""
        if live.token_ids:
            return 0, None
        candidates = [(_common_prefix(other.token_ids, ids), other) for other in self.residents() if other is not live]
        # of those sharing as much, one whose captured blob share can cut the prefix from (no copy of its cells
        # first: ~9 MB a time on SmolLM2), else the one holding fewest cells to copy
        return max(
            candidates, key=lambda c: (c[0], c[1].cache.captured is not None, -len(c[1].token_ids)), default=(0, None)
        )

    def stepped(self, lives: Sequence[Live], alone: bool) -> None:
        """`lives` consumed tokens, so they moved past any kept state; unless one ran `alone` (after
        solo()), the new cells went wherever cells were free, beside the others'."""
        for live in lives:
            live.cache.kept = live.cache.captured = None
            if live.cache.device is not None:
                self.device.drop(live.cache.device)
                live.cache.device = None
        if not alone:
            self._packed = None

    def park_others(self, lives: Sequence[Live]) -> None:
        """Park every resident Live but `lives`: their KV cells free up."""
        for other in self.residents():
            if not any(other is live for live in lives):
                self._park(other)

    def _evict(self, keep: Sequence[Live]) -> int:
        for seq, ref in self._seated.items():
            live = ref()
            if live is None:
                self._clear(seq)
                return self._free_seqs.pop()
            if not any(live is k for k in keep):
                self._park(live)
                return self._free_seqs.pop()
        raise EngramError(f"a step of {len(keep)} conversations needs more than the context's {self.sequences}.")

    # -- captured states: where a restore's blob comes from ------------------------------------------
    def blob_of(self, live: Live, take: Callable[[int], np.ndarray] | None = None) -> bytearray:
        """What `live` holds now, as one blob: copied out of its sequence while resident (into `take`'s memory:
        get_blob), else its parked blob."""
        return self.get_blob(live.cache.seq, take) if self.holds(live) else live.cache.blob

    def remember(self, live: Live, state: SessionState, blob: bytearray) -> None:
        """`state` was captured from `live` as views of `blob` (never modified again). Remember where it came
        from, until its tensors are collected: restoring it while its tensors are still those views takes
        `blob` as is (`original`: one copy, set_data, instead of two), or its kept sequence while one holds it
        (no copy: `keep`). And parking `live` before it steps again takes `blob` instead of a copy (a
        conversation idle since its reply was captured, parked when another runs alone, cost a 23 MB copy on
        Granite-4.0-H-350M, ~60 ms in fresh pages on this VM)."""
        resident = self.holds(live)
        _cache(live).captured = blob
        serial = self.remember_blob(state, blob)
        if resident and serial is not None:
            self.keep(live, serial, blob, state.n_tokens)

    def remember_blob(self, state: SessionState, blob) -> int | None:
        """`state`'s tensors are views of `blob` (llama_origins.Origins.remember); the serial it is known by."""
        return self.origins.remember(state, blob)

    def original(self, state: SessionState) -> tuple[bytearray, int] | None:
        """The blob `state`'s tensors are views of and its serial, while they still are (Origins.find)."""
        return self.origins.find(state)

    def _park(self, live: Live) -> None:
        parked = live.cache
        kept = self._kept.get(parked.kept)
        if kept is not None:
            parked.blob = kept.blob
        elif parked.captured is not None:
            parked.blob = parked.captured
        else:  # a Live that has consumed nothing has nothing to keep
            parked.blob = self.get_blob(parked.seq) if live.token_ids else None
        device = self.device
        # only cells that run from cell 0 without gaps can be copied (llama.cpp aborts on several ranges)
        if (
            device is not None
            and parked.blob is not None
            and not device.valid(parked.device)
            and (self._is_packed(live) or not self.has_kv)
        ):
            parked.device = device.save(parked.seq, len(parked.blob), parked)
        self._clear(parked.seq)

    def _load_parked(self, live: Live, seq: int) -> None:
        """Load a parked `live` (no kept state holds it) into the empty sequence `seq`: from its device copy
        while that still holds, else from its blob (also where the copy does not load: a KV cache with no free
        range of cells long enough refuses both alike, without harm: tests/engine/test_llama_device_copies.py)."""
        parked = live.cache
        t0 = time.perf_counter()
        if self.device is not None and self.device.load(parked.device, seq):
            source = "device"
        elif parked.blob is not None:
            if self.device is not None:
                self.device.drop(parked.device)  # its slot is free again (a copy that did not load is not kept)
            parked.device = None
            self._load(parked.blob, len(live.token_ids), seq)
            source = "blob"
        else:
            return
        self.restores[source] += 1
        ms = (time.perf_counter() - t0) * 1000
        parked.loaded = (parked.loaded[0], parked.loaded[1] + ms) if parked.loaded else (source, ms)

    def take_load(self, live: Live) -> tuple[str, float] | None:
        """How `live` was loaded since the last call ("device" or "blob" first, and the ms of all its loads),
        and forget it; None when it was not loaded (resident throughout, or from a kept sequence)."""
        if not isinstance(live.cache, ParkedState):
            return None
        loaded, live.cache.loaded = live.cache.loaded, None
        return loaded

    def release(self, live: Live) -> None:
        if isinstance(live.cache, ParkedState):
            if live.cache.seq is not None:
                self._clear(live.cache.seq)
            if self.device is not None:
                self.device.drop(live.cache.device)
        live.cache = None

    def _seat(self, live: Live, seq: int) -> None:
        live.cache.seq = seq
        self._seated[seq] = weakref.ref(live)

    def _take_seq(self, seq: int) -> int:
        self._free_seqs.remove(seq)
        return seq

    def _unseat(self, seq: int) -> None:
        live = self._seated.pop(seq)()
        if live is not None and isinstance(live.cache, ParkedState):
            live.cache.seq = None
        packed = self._packed() if self._packed is not None else None
        if packed is None or packed is live:
            self._packed = None
        self._give_back(seq)

    def _give_back(self, seq: int) -> None:
        self._free_seqs.append(seq)
        self._free_seqs.sort(reverse=True)  # pop() gives the lowest: sequence 0 when it is free

    def _reap(self) -> None:
        for seq in [s for s, ref in self._seated.items() if ref() is None]:
            self._clear(seq)

    def _load(self, blob: bytearray, n_tokens: int, seq: int) -> None:
        in_place = as_streams(blob, self.n_seq) if self.streams else None  # a restore laid out with room: no copy
        try:
            if in_place is not None:
                buf, n = in_place
            else:
                buf, n = of_streams(blob, self.n_seq, self._streams_buffer) if self.streams else (blob, len(blob))
            read = self._lib.llama_state_seq_set_data(self._ctx, (ctypes.c_uint8 * n).from_buffer(buf), n, seq)
        finally:
            if in_place is not None:
                one_stream_again(blob)
        if read != n:
            self._lib.llama_memory_seq_rm(self._mem, seq, -1, -1)
            self._give_back(seq)
            raise SnapshotMismatch(
                f"llama.cpp refused a state of {n_tokens} tokens "
                f"({take_errors() or 'no reason given'}); the context holds {self.n_ctx}."
            )

    def _clear(self, seq: int) -> None:
        # Metadata only: zeroing buffers would memset the whole KV cache (~5 ms at 512 MiB), and kept
        # states share its cells. Stale bytes are never read: KV cells outside a sequence are masked, and
        # a recurrent cell with no source is zeroed by the graph before use.
        self._lib.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self._unseat(seq)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _cache(live: Live) -> ParkedState:
    if not isinstance(live.cache, ParkedState):
        raise EngramError("this conversation state was released or belongs to another backend.")
    return live.cache
