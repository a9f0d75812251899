"""Per-layer state objects. All share one interface: kind, tensors(), from_tensors(), nbytes, to().

Shapes are batch-1 and exactly as the backend's cache holds them, e.g. for a Mamba2 layer
conv (1, conv_dim, d_conv) and recurrent (1, heads, head_dim, d_state); for attention
keys/values (1, kv_heads, tokens, head_dim). The arrays are the backend's kind: torch tensors on
transformers, numpy arrays on llama.cpp (store/arrays.py handles both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from engramctl.store import arrays
from engramctl.store.arrays import Array

TOKEN_DIM = -2  # attention keys/values grow along this dim: (1, kv_heads, tokens, head_dim)


def _nbytes(ts: dict[str, Array]) -> int:
    return sum(arrays.nbytes(t) for t in ts.values())


@dataclass(frozen=True)
class EmptyState:
    """A layer that keeps nothing between tokens (an MLP or MoE block in NemotronH)."""

    kind = "empty"

    def tensors(self) -> dict[str, Array]:
        return {}

    @classmethod
    def from_tensors(cls, ts: dict[str, Array]) -> "EmptyState":
        return cls()

    @property
    def nbytes(self) -> int:
        return 0

    def to(self, device: str) -> "EmptyState":
        return self


@dataclass(frozen=True)
class RecurrentState:
    """Mamba/GDN/conv layer: a fixed-size rolling conv window plus the recurrent (SSM) state.
    Either may be None (LFM2's conv layers have no recurrent state)."""

    conv: Array | None  # (1, conv_dim, d_conv)
    recurrent: Array | None  # Mamba2 (1, heads, head_dim, d_state); Mamba1 (1, d_inner, d_state)
    kind = "recurrent"

    def tensors(self) -> dict[str, Array]:
        return {k: v for k, v in (("conv", self.conv), ("recurrent", self.recurrent)) if v is not None}

    @classmethod
    def from_tensors(cls, ts: dict[str, Array]) -> "RecurrentState":
        return cls(conv=ts.get("conv"), recurrent=ts.get("recurrent"))

    @property
    def nbytes(self) -> int:
        return _nbytes(self.tensors())

    def to(self, device: str) -> "RecurrentState":
        return RecurrentState(
            *(None if t is None else arrays.to_device(t, device) for t in (self.conv, self.recurrent))
        )


@dataclass(frozen=True)
class AttentionState:
    keys: Array  # (1, kv_heads, tokens, head_dim)
    values: Array  # (1, kv_heads, tokens, head_dim)
    kind = "attention"

    def tensors(self) -> dict[str, Array]:
        return {"keys": self.keys, "values": self.values}

    @classmethod
    def from_tensors(cls, ts: dict[str, Array]) -> "AttentionState":
        return cls(keys=ts["keys"], values=ts["values"])

    @property
    def n_tokens(self) -> int:
        return self.keys.shape[TOKEN_DIM]

    @property
    def nbytes(self) -> int:
        return _nbytes(self.tensors())

    def to(self, device: str) -> "AttentionState":
        return AttentionState(arrays.to_device(self.keys, device), arrays.to_device(self.values, device))


@dataclass(frozen=True)
class HybridState:
    """A layer with both a recurrent mixer and attention (FalconH1 layers, Zamba2's shared-attention layers)."""

    recurrent: RecurrentState
    attention: AttentionState
    kind = "hybrid"

    def tensors(self) -> dict[str, Array]:
        return {**self.recurrent.tensors(), **self.attention.tensors()}

    @classmethod
    def from_tensors(cls, ts: dict[str, Array]) -> "HybridState":
        return cls(RecurrentState.from_tensors(ts), AttentionState.from_tensors(ts))

    @property
    def nbytes(self) -> int:
        return self.recurrent.nbytes + self.attention.nbytes

    def to(self, device: str) -> "HybridState":
        return HybridState(self.recurrent.to(device), self.attention.to(device))


@dataclass(frozen=True)
class NgramState:
    """An Engram (N-gram memory) layer's per-sequence state: its short conv window and the compressed ids
    of the last N-1 tokens, which the next positions' n-grams reach back into. A SessionState holds one
    after the decoder layers for each N-gram layer, in the model's N-gram layer order."""

    conv: Array  # (1, hidden, (kernel-1)*N) normalised gated values, oldest first
    lookback: Array  # (1, N-1) int64 compressed token ids, pad-filled before the sequence start
    kind = "ngram"

    def tensors(self) -> dict[str, Array]:
        return {"conv": self.conv, "lookback": self.lookback}

    @classmethod
    def from_tensors(cls, ts: dict[str, Array]) -> "NgramState":
        return cls(conv=ts["conv"], lookback=ts["lookback"])

    @property
    def nbytes(self) -> int:
        return _nbytes(self.tensors())

    def to(self, device: str) -> "NgramState":
        return NgramState(arrays.to_device(self.conv, device), arrays.to_device(self.lookback, device))


LayerState = Union[EmptyState, RecurrentState, AttentionState, HybridState, NgramState]
LAYER_KINDS: dict[str, type] = {
    c.kind: c for c in (EmptyState, RecurrentState, AttentionState, HybridState, NgramState)
}
