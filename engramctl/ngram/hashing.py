"""Suffix n-gram hashing exactly as the official demo's NgramHashMapping (spec §2.3-2.5).

For N-gram layer l, order n in 2..N and head k, a position t gets the head-local row index
    z = mix_{l,n}(t) mod p_{l,n,k},   mix_{l,n}(t) = XOR_{j<n} x'_{t-j} * m_{l,j}
over compressed token ids x', with positions before the sequence start read as the compressed pad id.
Multipliers and primes are functions of the config and the compressed vocabulary size only, so row ids
are known from token ids alone, before the backbone runs: that is what lets the tables be prefetched.
"""

from __future__ import annotations

import numpy as np

from engramctl.errors import UsageError
from engramctl.ngram.config import NgramConfig
from engramctl.ngram.primes import next_prime

__all__ = ["NgramConfig", "NgramHasher"]  # the config is defined next door and is part of this API

_INT64_MAX = 2**63 - 1
_LAYER_SEED_STRIDE = 10007  # the demo's per-layer seed offset


class NgramHasher:
    """Row ids of every N-gram layer from compressed token ids.

    `compressed_pad_id` is the pad id after tokenizer compression (spec §2.2 step 5), as the demo uses
    it: pass TokenMap.compressed_pad(config.pad_id). Without it config.pad_id is used as it is.
    """

    def __init__(self, config: NgramConfig, compressed_vocab_size: int, *, compressed_pad_id: int | None = None):
        if compressed_vocab_size < 1:
            raise UsageError(f"the compressed vocabulary must hold at least one id; got {compressed_vocab_size}.")
        pad = config.pad_id if compressed_pad_id is None else int(compressed_pad_id)
        if not 0 <= pad < compressed_vocab_size:
            raise UsageError(f"pad id {pad} is outside the compressed vocabulary of {compressed_vocab_size} ids.")
        self.config = config
        self.vocab_size = int(compressed_vocab_size)
        self.pad_id = pad
        n = config.max_ngram_size
        # Bounding every multiplier by (2^63-1)/V' keeps x'*m inside int64 for any compressed id x'.
        half = max(1, (_INT64_MAX // self.vocab_size) // 2)
        self._multipliers: dict[int, np.ndarray] = {}
        self._primes: dict[int, np.ndarray] = {}
        seen: set[int] = set()
        for layer in config.layer_ids:
            rng = np.random.default_rng(config.seed + _LAYER_SEED_STRIDE * layer)
            self._multipliers[layer] = rng.integers(0, half, size=n, dtype=np.int64) * 2 + 1  # odd
            primes = []
            for order in range(2, n + 1):
                # Restart at M0-1 per (layer, order); `seen` pushes later ones onto the next free primes.
                candidate = config.engram_vocab_size[order - 2] - 1
                for _head in range(config.n_head_per_ngram):
                    candidate = next_prime(candidate, seen)
                    seen.add(candidate)
                    primes.append(candidate)
            self._primes[layer] = np.array(primes, dtype=np.int64)
        self._offsets = {
            lay: np.concatenate([[0], np.cumsum(p)[:-1]]).astype(np.int64) for lay, p in self._primes.items()
        }

    # -- constants --------------------------------------------------------------------------------------
    def _layer(self, layer_id: int) -> int:
        if layer_id not in self._primes:
            raise UsageError(f"block {layer_id} has no N-gram layer; the config has {list(self.config.layer_ids)}.")
        return layer_id

    def multipliers(self, layer_id: int) -> np.ndarray:
        """(N,) int64 odd multipliers m_{l,j}, j = distance back from the current position."""
        return self._multipliers[self._layer(layer_id)].copy()

    def primes(self, layer_id: int) -> np.ndarray:
        """((N-1)*K,) int64 table sizes, order n ascending then head."""
        return self._primes[self._layer(layer_id)].copy()

    def offsets(self, layer_id: int) -> np.ndarray:
        """((N-1)*K,) int64 first row of each head in the layer's one flat table (exclusive prefix sum)."""
        return self._offsets[self._layer(layer_id)].copy()

    def rows(self, layer_id: int) -> int:
        """Total rows of the layer's flat table: the sum of its primes."""
        return int(self._primes[self._layer(layer_id)].sum())

    # -- hashing ----------------------------------------------------------------------------------------
    def hash(self, token_ids) -> dict[int, np.ndarray]:
        """{layer_id: int64 (batch, T, (N-1)*K)} head-local indices in [0, prime) of a whole sequence
        batch, `token_ids` a [batch][T] of compressed ids; the start is padded with the pad id."""
        ids = self._ids(token_ids, "token_ids")
        pad = np.full((ids.shape[0], self.config.max_ngram_size - 1), self.pad_id, dtype=np.int64)
        return self._hash_padded(np.concatenate([pad, ids], axis=1))

    def hash_continuation(self, lookback_ids, new_ids) -> dict[int, np.ndarray]:
        """hash() of only the new positions of sequences that already consumed tokens: `lookback_ids` is
        [batch][<= N-1], each sequence's last compressed ids before `new_ids` ([batch][T]); a shorter
        one (a sequence near its start) is left-padded with the pad id, as hash() pads the start. Equals
        hash(history + new)[:, -T:] for every chunking of the history (decode, chunked prefill, resume)."""
        new = self._ids(new_ids, "new_ids")
        return self._hash_padded(np.concatenate([self._lookback(lookback_ids, new.shape[0]), new], axis=1))

    def next_lookback(self, lookback_ids, new_ids) -> np.ndarray:
        """(batch, N-1) int64: the lookback to pass with the positions after `new_ids`."""
        new = self._ids(new_ids, "new_ids")
        both = np.concatenate([self._lookback(lookback_ids, new.shape[0]), new], axis=1)
        return both[:, both.shape[1] - (self.config.max_ngram_size - 1) :].copy()

    def _lookback(self, lookback_ids, batch: int) -> np.ndarray:
        width = self.config.max_ngram_size - 1
        rows = [list(r) for r in lookback_ids]
        if len(rows) != batch or any(len(r) > width for r in rows):
            raise UsageError(f"lookback_ids must hold, for each of {batch} sequences, at most {width} ids.")
        out = np.full((batch, width), self.pad_id, dtype=np.int64)
        for i, r in enumerate(rows):
            if r:
                out[i, width - len(r) :] = self._check_range(np.asarray(r, dtype=np.int64), "lookback_ids")
        return out

    def _ids(self, token_ids, what: str) -> np.ndarray:
        try:
            ids = np.asarray(token_ids, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise UsageError(f"{what} must be a rectangular [batch][T] of integer ids.") from None
        if ids.ndim != 2:
            raise UsageError(f"{what} must be a rectangular [batch][T] of integer ids; got {ids.ndim} dimensions.")
        return self._check_range(ids, what)

    def _check_range(self, ids: np.ndarray, what: str) -> np.ndarray:
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise UsageError(
                f"{what} holds ids outside the compressed vocabulary [0, {self.vocab_size}); "
                "compress raw token ids with the tokenizer's map first."
            )
        return ids

    def _hash_padded(self, x: np.ndarray) -> dict[int, np.ndarray]:
        """x: (batch, N-1+T) int64, the N-1 lookback ids then the T positions to hash."""
        n = self.config.max_ngram_size
        t = x.shape[1] - (n - 1)
        back = [x[:, n - 1 - j : n - 1 - j + t] for j in range(n)]  # back[j][:, t] = x'_{t-j}, each (batch, T)
        out = {}
        for layer in self.config.layer_ids:
            mult, primes, k = self._multipliers[layer], self._primes[layer], self.config.n_head_per_ngram
            mix = back[0] * mult[0]
            cols = []
            for order in range(2, n + 1):
                mix = np.bitwise_xor(mix, back[order - 1] * mult[order - 1])  # running XOR: order-n key
                cols.extend(mix % p for p in primes[(order - 2) * k : (order - 1) * k])
            out[layer] = np.stack(cols, axis=-1)  # (batch, T, (N-1)*K)
        return out
