"""Fusing the looked-up memory into the residual stream (spec §2.6-2.8, §2.11).

Per residual branch m, a scalar gate per token decides how much of the shared value v = W_V e enters:
    s = <RMSNorm_q(h_m), RMSNorm_k(W_K,m e)> / sqrt(d),   alpha = sigmoid(sign(s) * sqrt(max(|s|, 1e-6)))
The signed square root (what the demo, the training kernels and V4.1 run, not the paper's plain sigmoid)
keeps large dot products from saturating the sigmoid. `NgramFusion` is the demo's module (biased
projections, separate norms, short conv); `NgramFusionV41` is the conv-free production variant.
Both take hidden states (batch, T, branches, d): a plain pre-norm transformer has one branch.
"""

from __future__ import annotations

import torch
from torch import nn

from engramctl.errors import UsageError
from engramctl.ngram.shortconv import ShortConv

GATE_CLAMP = 1e-6


def signed_sqrt_sigmoid(score: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(torch.sign(score) * score.abs().clamp_min(GATE_CLAMP).sqrt())


def _check(hidden: torch.Tensor, memory: torch.Tensor, branches: int, d: int, d_mem: int) -> None:
    if hidden.dim() != 4 or hidden.shape[2:] != (branches, d):
        raise UsageError(f"hidden states must be (batch, T, {branches}, {d}); got {tuple(hidden.shape)}.")
    if tuple(memory.shape) != (hidden.shape[0], hidden.shape[1], d_mem):
        raise UsageError(f"memory must be (batch, T, {d_mem}) to match the hidden states; got {tuple(memory.shape)}.")


class NgramFusion(nn.Module):
    """The demo's N-gram fusion (its Engram module): out = H + Y, Y = U + SiLU(conv(RMSNorm(U))), U = alpha * v."""

    def __init__(
        self,
        memory_dim: int,
        hidden_size: int,
        branches: int = 1,
        kernel_size: int = 4,
        dilation: int = 3,
        conv_zero_init: bool = False,
    ):
        super().__init__()
        self.memory_dim, self.hidden_size, self.branches = memory_dim, hidden_size, branches
        self.value_proj = nn.Linear(memory_dim, hidden_size)
        self.key_projs = nn.ModuleList(nn.Linear(memory_dim, hidden_size) for _ in range(branches))
        # nn.RMSNorm's default eps (the dtype's machine epsilon), as in the demo
        self.key_norms = nn.ModuleList(nn.RMSNorm(hidden_size) for _ in range(branches))
        self.query_norms = nn.ModuleList(nn.RMSNorm(hidden_size) for _ in range(branches))
        self.short_conv = ShortConv(hidden_size, branches, kernel_size, dilation, zero_init=conv_zero_init)

    def gates(self, hidden: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """(batch, T, branches, 1) alpha per token and branch."""
        scores = []
        for m in range(self.branches):
            key = self.key_norms[m](self.key_projs[m](memory))  # (batch, T, d)
            query = self.query_norms[m](hidden[:, :, m])  # (batch, T, d): the raw residual stream
            scores.append((key * query).sum(dim=-1) / self.hidden_size**0.5)
        return signed_sqrt_sigmoid(torch.stack(scores, dim=-1)).unsqueeze(-1)

    def forward(
        self, hidden: torch.Tensor, memory: torch.Tensor, conv_state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden (batch, T, branches, d), memory (batch, T, d_mem) concatenated rows, conv_state as
        ShortConv keeps it (None: a fresh sequence). Returns (hidden + Y, the conv state after T)."""
        _check(hidden, memory, self.branches, self.hidden_size, self.memory_dim)
        gated = self.gates(hidden, memory) * self.value_proj(memory).unsqueeze(2)  # (batch, T, branches, d)
        y, new_state = self.short_conv(gated, conv_state)
        return hidden + y, new_state


class NgramFusionV41(nn.Module):
    """DeepSeek-V4.1's variant: one bias-free wkv projection (branches keys, then the value), norm
    weights applied as their product, no conv, so no per-sequence state; out = H + alpha * v."""

    def __init__(self, memory_dim: int, hidden_size: int, branches: int = 4, eps: float = 1e-6):
        super().__init__()
        self.memory_dim, self.hidden_size, self.branches, self.eps = memory_dim, hidden_size, branches, eps
        self.wkv = nn.Linear(memory_dim, (branches + 1) * hidden_size, bias=False)
        self.q_weight = nn.Parameter(torch.ones(branches, hidden_size))
        self.k_weight = nn.Parameter(torch.ones(branches, hidden_size))

    def _rms(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)

    def forward(self, hidden: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """mask (batch, T) bool, False where a token is not text: its gate is 0, its residual untouched."""
        _check(hidden, memory, self.branches, self.hidden_size, self.memory_dim)
        batch, t = memory.shape[:2]
        kv = self.wkv(memory).view(batch, t, self.branches + 1, self.hidden_size)
        keys, value = kv[:, :, : self.branches], kv[:, :, self.branches :]  # (b, T, M, d), (b, T, 1, d)
        weight = self.q_weight * self.k_weight  # (M, d): only the product is ever used
        scores = (self._rms(hidden) * self._rms(keys) * weight).sum(dim=-1) / self.hidden_size**0.5
        alpha = signed_sqrt_sigmoid(scores).unsqueeze(-1)  # (batch, T, M, 1)
        if mask is not None:
            if tuple(mask.shape) != (batch, t):
                raise UsageError(f"mask must be (batch, T) = {(batch, t)}; got {tuple(mask.shape)}.")
            alpha = alpha * mask[:, :, None, None].to(alpha.dtype)
        return hidden + alpha * value
