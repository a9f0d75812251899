"""The short dilated depthwise causal convolution after the gate (spec §2.7), streamable:

    Y = U + SiLU(conv_{w, dilation}(RMSNorm_c(U)))   per residual branch

A sequence's conv state is the last (w-1)*dilation normalised U vectors, channels first like a Mamba
conv state. Feeding a sequence in chunks with the state carried over gives the same output as feeding it
whole: each output is one fixed-order sum of w taps, whatever the chunk length.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engramctl.errors import UsageError


class ShortConv(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        branches: int = 1,
        kernel_size: int = 4,
        dilation: int = 3,
        eps: float = 1e-5,
        zero_init: bool = False,
    ):
        super().__init__()
        if kernel_size < 1 or dilation < 1:
            raise UsageError(f"the short conv needs kernel_size >= 1 and dilation >= 1; got {kernel_size}, {dilation}.")
        self.hidden_size, self.branches, self.kernel_size, self.dilation = hidden_size, branches, kernel_size, dilation
        self.norms = nn.ModuleList(nn.RMSNorm(hidden_size, eps=eps) for _ in range(branches))
        channels = branches * hidden_size
        self.weight = nn.Parameter(torch.empty(channels, kernel_size))  # (branches*d, taps); tap w-1 = now
        if zero_init:  # the paper's training init: Y = U until the conv learns something
            nn.init.zeros_(self.weight)
        else:  # nn.Conv1d's default for a depthwise conv (fan_in = taps), as the demo gets it
            bound = 1.0 / math.sqrt(kernel_size)
            nn.init.uniform_(self.weight, -bound, bound)

    @property
    def state_len(self) -> int:
        """(w-1)*dilation: positions of history each output reaches back to."""
        return (self.kernel_size - 1) * self.dilation

    def initial_state(self, batch: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
        """(batch, branches*d, state_len) zeros: positions before the start contribute nothing."""
        return torch.zeros(batch, self.branches * self.hidden_size, self.state_len, dtype=dtype, device=device)

    def forward(self, u: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """u: (batch, T, branches, d) gated values. Returns (Y, the state after these T positions)."""
        batch, t, branches, d = u.shape
        if (branches, d) != (self.branches, self.hidden_size):
            raise UsageError(
                f"the short conv takes (batch, T, {self.branches}, {self.hidden_size}); got {tuple(u.shape)}."
            )
        if state is None:
            state = self.initial_state(batch, u.dtype, u.device)
        elif tuple(state.shape) != (batch, branches * d, self.state_len):
            raise UsageError(f"conv state must be (batch, {branches * d}, {self.state_len}); got {tuple(state.shape)}.")
        normed = torch.cat([self.norms[m](u[:, :, m]) for m in range(branches)], dim=-1)  # (batch, T, branches*d)
        window = torch.cat([state, normed.transpose(1, 2)], dim=-1)  # (batch, branches*d, state_len + T)
        # Output t reads window[state_len + t - (w-1-j)*dilation] for tap j; the taps are summed in one
        # fixed order with separate multiply and add, so a chunked run reproduces a whole one bit for bit.
        acc = self.weight[:, 0:1] * window[:, :, 0:t]
        for j in range(1, self.kernel_size):
            start = j * self.dilation
            acc = acc + self.weight[:, j : j + 1] * window[:, :, start : start + t]
        conv = nn.functional.silu(acc).transpose(1, 2).reshape(batch, t, branches, d)
        new_state = window[:, :, window.shape[-1] - self.state_len :].clone()
        return u + conv, new_state
