"""What one llama_decode is fed: a llama_batch allocated once, its arrays numpy's, and the logits it returns.

Every step of the daemon is a llama_decode; one stream decodes one token a step, so filling the batch and
reading its logits is on the path of every token (issue 18). The arrays are numpy-owned and filled by slices
(a token: five scalar stores), instead of a llama_batch_init batch written element by element through ctypes
pointers; the logits row is read through one cached ctypes array type. llama_decode copies what it needs from
the batch during the call, so the arrays are reused at once.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from engramctl.engine.llama_lib import take_errors
from engramctl.errors import EngramError


class Batch:
    """Up to `capacity` tokens, each of one sequence; logits are asked for each piece's last token only."""

    def __init__(self, lib, capacity: int, n_vocab: int):
        self.capacity = capacity
        self.token = np.zeros(capacity, np.int32)
        self.pos = np.zeros(capacity, np.int32)
        self.n_seq_id = np.ones(capacity, np.int32)  # one sequence per token, always
        self.seq = np.zeros(capacity, np.int32)
        self.logits = np.zeros(capacity, np.int8)
        # seq_id is an array of pointers, one per token, to that token's sequence ids: here its element of `seq`
        self._seq_ptrs = np.arange(capacity, dtype=np.uintp) * self.seq.itemsize + self.seq.ctypes.data
        i32 = ctypes.POINTER(ctypes.c_int32)
        self.c = lib.llama_batch(
            n_tokens=0,
            token=self.token.ctypes.data_as(i32),
            embd=None,
            pos=self.pos.ctypes.data_as(i32),
            n_seq_id=self.n_seq_id.ctypes.data_as(i32),
            seq_id=self._seq_ptrs.ctypes.data_as(ctypes.POINTER(i32)),
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )
        self._n_vocab = n_vocab
        # llama_get_logits_ith with a plain address for its result: llama-cpp-python's binding returns a
        # POINTER(c_float), and turning that into an array cost ~25 us a token in the daemon (issue 18)
        self._logits_ith = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(
            ("llama_get_logits_ith", lib.llama_cpp._lib)
        )
        self._views: dict[int, np.ndarray] = {}  # address -> a numpy view of the row there

    def fill(self, pieces: Sequence[tuple[int, int, Sequence[int]]]) -> list[int]:
        """pieces: (sequence id, position of its first token, token ids), at most `capacity` tokens in all.
        Returns the row of each piece's last token (where its logits will be)."""
        rows, n = [], 0
        for seq, past, ids in pieces:
            k = len(ids)
            if k == 1:  # a generating conversation's token: scalar stores, no temporary arrays
                self.token[n], self.pos[n], self.seq[n], self.logits[n] = ids[0], past, seq, 1
            else:
                self.token[n : n + k] = ids
                self.pos[n : n + k] = np.arange(past, past + k, dtype=np.int32)
                self.seq[n : n + k] = seq
                self.logits[n : n + k - 1] = 0
                self.logits[n + k - 1] = 1
            n += k
            rows.append(n - 1)
        self.c.n_tokens = n
        return rows

    @property
    def n_tokens(self) -> int:
        return int(self.c.n_tokens)

    def logits_of(self, ctx, row: int) -> np.ndarray:
        """A copy of the logits llama.cpp computed at batch row `row` (vocab,) float32."""
        address = self._logits_ith(ctx, row)
        if not address:
            raise EngramError(f"llama.cpp has no logits for batch row {row}: {take_errors() or 'see the log'}")
        view = self._views.get(address)
        if view is None:
            # Rows sit at a few addresses in llama.cpp's output buffer (one per output row; new ones when it
            # grows): a view made once per address, each read only right after the decode that wrote it.
            if len(self._views) >= 4 * self.capacity:
                self._views.clear()
            buf = (ctypes.c_float * self._n_vocab).from_address(address)
            view = self._views[address] = np.frombuffer(buf, dtype=np.float32)
        return view.copy()
