"""Fit the Mamba2 chunked scan's chunk length to each forward's input.

Why: transformers' PyTorch reference scan (`mamba2_chunk_scan` / `torch_chunk_scan_combined` in the
Mamba2, GraniteMoeHybrid, NemotronH, Bamba, FalconH1 and Zamba2 modeling files; the only scan on a
CPU) zero-pads the sequence up to a multiple of the mixer's `chunk_size` (config 256 on Granite 4.0-H)
before its O(chunk^2) intra-chunk einsums. Any multi-token input, including a short message on a
restored state (seq_len > 1 with a cache takes the chunk form; only seq_len == 1 takes the recurrent
form), therefore pays for a whole chunk: 32 tokens cost about what 256 cost.

The SSD chunked scan gives the same result for any chunk length (chunks only split one causal sum
into intra-chunk blocks plus a state passed between chunks; fp32 rounding aside), and each mixer
reads `self.chunk_size` afresh on every forward. So around each forward we set it to the shortest
length that keeps the same number of chunks, `ceil(T / ceil(T / C))`: T itself below C (no padding
at all), C itself at multiples of C (a chunk-aligned prefill runs exactly as before), never above C
(memory of the intra-chunk blocks never grows).

Only the PyTorch scan pads. mamba-ssm's Triton kernels mask instead and are tuned for the configured
chunk, so when transformers bound the scan to mamba-ssm (hf_kernels.py reads that binding) nothing changes.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from torch import nn

from engramctl.engine.hf_kernels import model_bindings


def fitted_chunk_tokens(n_tokens: int, chunk_tokens: int) -> int:
    """Shortest chunk length that splits `n_tokens` into as many chunks as `chunk_tokens` would."""
    if n_tokens < 1 or chunk_tokens < 1:
        raise ValueError(f"need positive lengths, got n_tokens={n_tokens}, chunk_tokens={chunk_tokens}")
    n_chunks = -(-n_tokens // chunk_tokens)
    return -(-n_tokens // n_chunks)


def torch_scan_in_use(model: nn.Module) -> bool:
    """True when transformers bound `model`'s chunked scan to its PyTorch reference, i.e. did not bind
    mamba-ssm's `mamba_chunk_scan_combined` (hf_kernels.py reads the binding; mamba-ssm 2.x does not export
    that op from its package root, so `getattr(mamba_ssm, ...)` would miss it)."""
    return not any(b.func_name == "mamba_chunk_scan_combined" and b.kernel for b in model_bindings(model))


@dataclass
class ScanChunks:
    """The model's chunked-scan mixers and their configured chunk lengths."""

    mixers: list[nn.Module] = field(default_factory=list)
    base_tokens: list[int] = field(default_factory=list)
    enabled: bool = True  # a switch for benchmarks (before/after in one process) and debugging

    @classmethod
    def find(cls, model: nn.Module, mixer_class: str | None) -> "ScanChunks":
        """Mixers of class `mixer_class` that hold an int `chunk_size`; none when the family has no
        chunked scan, or when the kernels (which do not pad) run it."""
        if mixer_class is None or not torch_scan_in_use(model):
            return cls()
        mixers = [
            m
            for m in model.modules()
            if type(m).__name__ == mixer_class and isinstance(getattr(m, "chunk_size", None), int)
        ]
        return cls(mixers=mixers, base_tokens=[m.chunk_size for m in mixers])

    @contextmanager
    def fitted(self, n_tokens: int) -> Iterator[None]:
        """Run the block with every mixer's chunk fitted to an `n_tokens` input, then restore it.
        Restores the configured length (not the value found on entry), so an interrupted or
        overlapping forward can never leave a shrunk chunk behind; an overlap would only cost speed,
        never exactness (every chunk length gives the same scan)."""
        if not self.enabled or not self.mixers or n_tokens < 1:
            yield
            return
        try:
            for m, base in zip(self.mixers, self.base_tokens):
                m.chunk_size = fitted_chunk_tokens(n_tokens, base)
            yield
        finally:
            for m, base in zip(self.mixers, self.base_tokens):
                m.chunk_size = base
