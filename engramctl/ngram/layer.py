"""An N-gram layer in one piece: its flat table, its frozen hash constants and its fusion, initialised
from a seed as the official demo initialises them (tables N(0,1), projections nn.Linear's default).

Rows are read through `gather_rows` only when the layer holds its table as an nn.Embedding (tests, the
reference); the engine builds the layer without one (`with_table=False`) and hands each forward the rows
its TableSet read (ngram/tableset.py: RAM, or disk through the prefetcher).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from engramctl.errors import UsageError
from engramctl.ngram.fusion import NgramFusion
from engramctl.ngram.hashing import NgramConfig, NgramHasher

_LAYER_SEED_STRIDE = 10007  # as the hash multipliers: one stream per layer, fixed by (seed, layer)


def gather_rows(table: nn.Embedding, row_ids: torch.Tensor) -> torch.Tensor:
    """(batch, T, (N-1)*K) global row ids -> (batch, T, d_mem): the rows concatenated, order n then head."""
    return nn.functional.embedding(row_ids, table.weight).flatten(-2)


class NgramLayer(nn.Module):
    """One N-gram layer on a plain (one-branch) residual stream: out = h + Y (spec §2.8)."""

    def __init__(
        self, config: NgramConfig, hasher: NgramHasher, layer_id: int, hidden_size: int, with_table: bool = True
    ):
        super().__init__()
        self.layer_id = layer_id
        # (rows, D_h), flat over (n, k); None when the rows come from a table file (TableSet)
        self.table = nn.Embedding(hasher.rows(layer_id), config.head_dim) if with_table else None
        # The hash constants are frozen with the weights (numpy does not promise its RNG stream across
        # versions), and being buffers they are part of the model fingerprint.
        self.register_buffer("offsets", torch.from_numpy(hasher.offsets(layer_id)))  # ((N-1)*K,)
        self.register_buffer("primes", torch.from_numpy(hasher.primes(layer_id)))
        self.register_buffer("multipliers", torch.from_numpy(hasher.multipliers(layer_id)))  # (N,)
        self.fusion = NgramFusion(
            config.memory_dim, hidden_size, branches=1, kernel_size=config.kernel_size, dilation=config.max_ngram_size
        )

    @property
    def conv_state_len(self) -> int:
        return self.fusion.short_conv.state_len

    def forward(
        self,
        hidden: torch.Tensor,
        local_ids: np.ndarray,
        conv_state: torch.Tensor | None,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden (batch, T, d) residual stream at the block input; local_ids (batch, T, (N-1)*K) head-local
        indices from NgramHasher; conv_state (batch, d, (w-1)*N) or None; rows (batch, T, (N-1)*K, D_h) the
        rows of those ids when read elsewhere (required without a table). Returns (h + Y, new conv state)."""
        if tuple(local_ids.shape[:2]) != tuple(hidden.shape[:2]):
            raise UsageError(
                f"row ids cover {tuple(local_ids.shape[:2])} positions; the hidden states {tuple(hidden.shape[:2])}."
            )
        if rows is not None:
            memory = rows.to(hidden.device, hidden.dtype).flatten(-2)  # (batch, T, d_mem)
        elif self.table is not None:
            ids = torch.from_numpy(np.ascontiguousarray(local_ids)).to(self.offsets.device) + self.offsets
            memory = gather_rows(self.table, ids).to(hidden.dtype)
        else:
            raise UsageError(f"the N-gram layer at block {self.layer_id} holds no table: pass the rows it reads.")
        out, new_state = self.fusion(hidden.unsqueeze(2), memory, conv_state)
        return out.squeeze(2), new_state


class NgramStack(nn.Module):
    """The N-gram layers of one model, keyed by block index."""

    def __init__(self, config: NgramConfig, hasher: NgramHasher, hidden_size: int, with_tables: bool = True):
        super().__init__()
        self.config = config
        self.hasher = hasher
        layers = {}
        for layer_id in config.layer_ids:
            # Built under a private seed, so two processes get the same weights (a snapshot written by one
            # resumes in the other) and the caller's global RNG stream is left as it was.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed + _LAYER_SEED_STRIDE * layer_id)
                layers[str(layer_id)] = NgramLayer(config, hasher, layer_id, hidden_size, with_tables)
        self.layers = nn.ModuleDict(layers)

    def layer(self, layer_id: int) -> NgramLayer:
        return self.layers[str(layer_id)]
