"""Choosing the next token from logits: greedy at temperature 0, else temperature / top-k / top-p."""

from __future__ import annotations

import torch

from engramctl.engine.sampling_params import SamplingParams

__all__ = ["SamplingParams", "sample"]  # SamplingParams is defined (torch-free) in sampling_params.py


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
