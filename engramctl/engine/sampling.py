"""Choosing the next token from logits: greedy at temperature 0, else temperature / top-k / top-p."""

from __future__ import annotations

from typing import Sequence

import torch

from engramctl.engine.sampling_params import SamplingParams

__all__ = ["SamplingParams", "sample"]  # SamplingParams is defined (torch-free) in sampling_params.py


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator, recent: Sequence[int] = ()) -> int:
    """logits: (vocab,) float32; `recent`: the token ids repeat_penalty applies to."""
    if params.repeat_penalty != 1.0 and recent:
        # llama.cpp's rule: a positive logit is divided by the penalty, a negative one multiplied. On a
        # float64 copy: the caller's logits stay as they are, and the scaling below needs float64 anyway.
        ids = torch.tensor(sorted(set(recent)), dtype=torch.long)
        logits = logits.to("cpu", torch.float64, copy=True)
        seen = logits[ids]
        logits[ids] = torch.where(seen > 0, seen / params.repeat_penalty, seen * params.repeat_penalty)
    if params.temperature == 0:
        return int(torch.argmax(logits))
    logits = logits.double().cpu()  # no copy when the penalty above already made one
    # Shifted so the best score is 0, and in float64, before dividing: a tiny temperature (5e-324 is > 0, so
    # allowed) then sends the other scores to -inf instead of every score to +-inf or NaN (float32 rounds such
    # a temperature to 0), whose softmax is NaN. The distribution is the same.
    scores = ((logits - logits.max()) / params.temperature).float()
    ids = None  # (kept,) token ids of `scores`, most likely first; None: scores is the whole vocabulary
    if params.top_k and params.top_k < scores.numel():
        # the k best only, sorted: top-p below then sorts k scores, not the vocabulary (~2 ms a token at 49k)
        scores, ids = torch.topk(scores, params.top_k)
    if params.top_p < 1.0:
        if ids is None:
            scores, ids = torch.sort(scores, descending=True)
        probs = torch.softmax(scores, dim=-1)
        # keep a token while the tokens before it cover less than top_p; the first one always stays
        keep = (torch.cumsum(probs, dim=-1) - probs) < params.top_p
        keep[0] = True  # said, not derived: a top_p under float32's smallest (5e-324) compares as 0 < 0
        scores, ids = scores[keep], ids[keep]
    pick = int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator))
    return pick if ids is None else int(ids[pick])
