"""Choosing the next token from logits: greedy at temperature 0, else temperature / top-k / top-p."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engramctl.errors import UsageError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    max_tokens: int = 512
    stop: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self):
        if self.temperature < 0:
            raise UsageError(f"temperature must be >= 0 (got {self.temperature}).")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top_p must be in (0, 1] (got {self.top_p}).")
        if self.top_k < 0:
            raise UsageError(f"top_k must be >= 0 (got {self.top_k}).")
        if self.max_tokens < 1:
            raise UsageError(f"max_tokens must be >= 1 (got {self.max_tokens}).")

    def generator(self) -> torch.Generator:
        g = torch.Generator()
        if self.seed is not None:
            g.manual_seed(self.seed)
        else:
            g.seed()
        return g


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """logits: (vocab,) float32."""
    if params.temperature == 0:
        return int(torch.argmax(logits))
    scores = logits.float().cpu() / params.temperature
    if params.top_k:
        kth = torch.topk(scores, min(params.top_k, scores.numel())).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        # drop a token when the tokens before it already cover top_p; the first one always stays
        drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        scores[order[drop]] = float("-inf")
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
