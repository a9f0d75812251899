"""The N-gram memory config: the official demo's EngramConfig fields (spec §1) with its defaults, validated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from engramctl.errors import UsageError


@dataclass(frozen=True)
class NgramConfig:
    """The demo's EngramConfig fields with its defaults (DeepSeek-V3 tokenizer, 1024-wide backbone).
    Lists are kept as tuples so a config can be hashed and shared."""

    max_ngram_size: int = 3
    n_head_per_ngram: int = 8
    n_embed_per_ngram: int = 512
    engram_vocab_size: Sequence[int] = field(default_factory=lambda: [129280 * 5] * 2)  # index n-2 -> order n
    layer_ids: Sequence[int] = field(default_factory=lambda: [1, 15])
    pad_id: int = 2  # a raw token id; the hash uses its compressed id
    seed: int = 0
    kernel_size: int = 4

    def __post_init__(self) -> None:
        object.__setattr__(self, "engram_vocab_size", tuple(int(v) for v in self.engram_vocab_size))
        object.__setattr__(self, "layer_ids", tuple(int(i) for i in self.layer_ids))
        if self.max_ngram_size < 2:
            raise UsageError(f"max_ngram_size must be at least 2 (bigrams); got {self.max_ngram_size}.")
        if self.n_head_per_ngram < 1 or self.n_embed_per_ngram % self.n_head_per_ngram:
            raise UsageError(
                f"n_embed_per_ngram ({self.n_embed_per_ngram}) must split evenly over "
                f"n_head_per_ngram ({self.n_head_per_ngram}) heads."
            )
        if len(self.engram_vocab_size) != self.max_ngram_size - 1 or min(self.engram_vocab_size) < 2:
            raise UsageError(
                f"engram_vocab_size needs one table size of at least 2 per order 2..{self.max_ngram_size}; "
                f"got {list(self.engram_vocab_size)}."
            )
        if not self.layer_ids or len(set(self.layer_ids)) != len(self.layer_ids) or min(self.layer_ids) < 0:
            raise UsageError(f"layer_ids must be distinct non-negative block indices; got {list(self.layer_ids)}.")
        if self.kernel_size < 1 or self.pad_id < 0:
            raise UsageError(f"kernel_size must be >= 1 and pad_id >= 0; got {self.kernel_size}, {self.pad_id}.")

    @property
    def head_dim(self) -> int:
        """D_h: width of one table row."""
        return self.n_embed_per_ngram // self.n_head_per_ngram

    @property
    def n_columns(self) -> int:
        """(N-1)*K: rows read per token per layer."""
        return (self.max_ngram_size - 1) * self.n_head_per_ngram

    @property
    def memory_dim(self) -> int:
        """d_mem = (N-1)*K*D_h: width of the concatenated memory vector."""
        return (self.max_ngram_size - 1) * self.n_embed_per_ngram


def ngram_config(layers: str | None, table_rows: int, seed: int = 0) -> NgramConfig | None:
    """The settings' "1,15" and rows per (order, head) table as a config; every other field is the demo's."""
    if not layers or not layers.strip():
        return None
    try:
        ids = [int(x) for x in layers.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"N-gram layers must be comma-separated block indices such as 1,15; got {layers!r}.") from None
    return NgramConfig(layer_ids=ids, engram_vocab_size=[table_rows] * 2, seed=seed)
