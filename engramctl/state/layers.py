"""Per-layer state objects. All share one interface: kind, tensors(), from_tensors(), nbytes, to().

Shapes are batch-1 and exactly as the backend's cache holds them, e.g. for a Mamba2 layer
conv (1, conv_dim, d_conv) and recurrent (1, heads, head_dim, d_state); for attention
keys/values (1, kv_heads, tokens, head_dim).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

TOKEN_DIM = -2  # attention keys/values grow along this dim: (1, kv_heads, tokens, head_dim)


def _nbytes(ts: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts.values())


@dataclass(frozen=True)
class EmptyState:
    """A layer that keeps nothing between tokens (an MLP or MoE block in NemotronH)."""

    kind = "empty"

    def tensors(self) -> dict[str, torch.Tensor]:
        return {}

    @classmethod
    def from_tensors(cls, ts: dict[str, torch.Tensor]) -> "EmptyState":
        return cls()

    @property
    def nbytes(self) -> int:
        return 0

    def to(self, device: torch.device | str) -> "EmptyState":
        return self


@dataclass(frozen=True)
class RecurrentState:
    """Mamba/GDN/conv layer: a fixed-size rolling conv window plus the recurrent (SSM) state.
    Either may be None (LFM2's conv layers have no recurrent state)."""

    conv: torch.Tensor | None  # (1, conv_dim, d_conv)
    recurrent: torch.Tensor | None  # Mamba2 (1, heads, head_dim, d_state); Mamba1 (1, d_inner, d_state)
    kind = "recurrent"

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in (("conv", self.conv), ("recurrent", self.recurrent)) if v is not None}

    @classmethod
    def from_tensors(cls, ts: dict[str, torch.Tensor]) -> "RecurrentState":
        return cls(conv=ts.get("conv"), recurrent=ts.get("recurrent"))

    @property
    def nbytes(self) -> int:
        return _nbytes(self.tensors())

    def to(self, device: torch.device | str) -> "RecurrentState":
        return RecurrentState(*(None if t is None else t.to(device) for t in (self.conv, self.recurrent)))


@dataclass(frozen=True)
class AttentionState:
    keys: torch.Tensor  # (1, kv_heads, tokens, head_dim)
    values: torch.Tensor  # (1, kv_heads, tokens, head_dim)
    kind = "attention"

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"keys": self.keys, "values": self.values}

    @classmethod
    def from_tensors(cls, ts: dict[str, torch.Tensor]) -> "AttentionState":
        return cls(keys=ts["keys"], values=ts["values"])

    @property
    def n_tokens(self) -> int:
        return self.keys.shape[TOKEN_DIM]

    @property
    def nbytes(self) -> int:
        return _nbytes(self.tensors())

    def to(self, device: torch.device | str) -> "AttentionState":
        return AttentionState(self.keys.to(device), self.values.to(device))


@dataclass(frozen=True)
class HybridState:
    """A layer with both a recurrent mixer and attention (FalconH1 layers, Zamba2's shared-attention layers)."""

    recurrent: RecurrentState
    attention: AttentionState
    kind = "hybrid"

    def tensors(self) -> dict[str, torch.Tensor]:
        return {**self.recurrent.tensors(), **self.attention.tensors()}

    @classmethod
    def from_tensors(cls, ts: dict[str, torch.Tensor]) -> "HybridState":
        return cls(RecurrentState.from_tensors(ts), AttentionState.from_tensors(ts))

    @property
    def nbytes(self) -> int:
        return self.recurrent.nbytes + self.attention.nbytes

    def to(self, device: torch.device | str) -> "HybridState":
        return HybridState(self.recurrent.to(device), self.attention.to(device))


@dataclass(frozen=True)
class NgramState:
    """An Engram (N-gram memory) layer's per-sequence state: its short conv window and the compressed ids
    of the last N-1 tokens, which the next positions' n-grams reach back into. A SessionState holds one
    after the decoder layers for each N-gram layer, in the model's N-gram layer order."""

    conv: torch.Tensor  # (1, hidden, (kernel-1)*N) normalised gated values, oldest first
    lookback: torch.Tensor  # (1, N-1) int64 compressed token ids, pad-filled before the sequence start
    kind = "ngram"

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"conv": self.conv, "lookback": self.lookback}

    @classmethod
    def from_tensors(cls, ts: dict[str, torch.Tensor]) -> "NgramState":
        return cls(conv=ts["conv"], lookback=ts["lookback"])

    @property
    def nbytes(self) -> int:
        return _nbytes(self.tensors())

    def to(self, device: torch.device | str) -> "NgramState":
        return NgramState(self.conv.to(device), self.lookback.to(device))


LayerState = Union[EmptyState, RecurrentState, AttentionState, HybridState, NgramState]
LAYER_KINDS: dict[str, type] = {
    c.kind: c for c in (EmptyState, RecurrentState, AttentionState, HybridState, NgramState)
}
