"""Choosing the next token from logits: penalties and logit_bias, then greedy at temperature 0, else
temperature / min-p / top-k / top-p.

Every option may take any value its schema allows (engine/sampling_params.py), denormals included, and
no combination may give NaN probabilities: the scores are worked in float64, a NaN logit counts as
impossible, infinitely favoured tokens (a positive logit divided by a denormal repeat_penalty) share the
draw, and the best score is shifted to 0 before the temperature divides, so at least one token always
keeps a probability of 1 before normalisation.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import torch

from engramctl.engine.sampling_params import SamplingParams

__all__ = ["SamplingParams", "sample", "scores"]  # SamplingParams is defined (torch-free) in sampling_params.py


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator, recent: Sequence[int] = ()) -> int:
    """logits: (vocab,) float32; `recent`: the token ids the penalties look at (oldest first)."""
    if params.temperature == 0 and not params.penalizes and not params.logit_bias and logits.device.type == "cpu":
        # Plain greedy, the API's default at temperature 0, without scores()' float64 passes over the vocabulary
        # (~0.3 ms a token at 49k, on the path every streamed token takes). numpy's argmax takes the first
        # maximum as torch's does; a NaN would be its answer, and then the general path below decides.
        values = logits.numpy()
        best = int(values.argmax())
        if not math.isnan(values[best]):
            return best
    s = scores(logits, params, recent)
    if params.temperature == 0:
        return int(torch.argmax(s))
    # s <= 0 with a 0 in it, so dividing never makes NaN: a tiny temperature (5e-324 is > 0, so allowed) sends
    # every other score to -inf, which is greedy, as it should be.
    s = s / params.temperature
    if params.min_p > 0:
        # min-p: a token stays when its probability is at least min_p times the best one's (whose score is 0)
        s = torch.where(s >= math.log(params.min_p), s, -math.inf)
    s = s.float()
    ids = None  # (kept,) token ids of `s`, most likely first; None: s is the whole vocabulary
    if params.top_k and params.top_k < s.numel():
        # the k best only, sorted: top-p below then sorts k scores, not the vocabulary (~2 ms a token at 49k)
        s, ids = torch.topk(s, params.top_k)
    if params.top_p < 1.0:
        if ids is None:
            s, ids = torch.sort(s, descending=True)
        probs = torch.softmax(s, dim=-1)
        # keep a token while the tokens before it cover less than top_p; the first one always stays
        keep = (torch.cumsum(probs, dim=-1) - probs) < params.top_p
        keep[0] = True  # said, not derived: a top_p under float32's smallest (5e-324) compares as 0 < 0
        s, ids = s[keep], ids[keep]
    pick = int(torch.multinomial(torch.softmax(s, dim=-1), 1, generator=generator))
    return pick if ids is None else int(ids[pick])


def scores(logits: torch.Tensor, params: SamplingParams, recent: Sequence[int] = ()) -> torch.Tensor:
    """The logits after the penalties and logit_bias, as float64 scores whose best is exactly 0 and none is
    NaN or +inf (a new tensor: the caller's logits stay as they are)."""
    s = logits.to("cpu", torch.float64, copy=True)
    n = s.numel()
    if params.penalizes and recent:
        counts = Counter(t for t in recent if 0 <= t < n)
        if counts:
            ids = torch.tensor(sorted(counts), dtype=torch.long)
            seen = s[ids]
            if params.repeat_penalty != 1.0:
                # llama.cpp's rule: a positive logit is divided by the penalty, a negative one multiplied
                seen = torch.where(seen > 0, seen / params.repeat_penalty, seen * params.repeat_penalty)
            # OpenAI's rule: minus frequency_penalty per occurrence, minus presence_penalty once
            times = torch.tensor([counts[int(t)] for t in ids], dtype=torch.float64)
            seen = seen - times * params.frequency_penalty - params.presence_penalty
            s[ids] = seen
    for token, bias in params.logit_bias:
        if token < n:  # an id past the logits is the route's to refuse; here it changes nothing
            s[token] += bias
    s = torch.where(torch.isnan(s), -math.inf, s)
    top = float(s.max())
    if top == math.inf:  # infinitely favoured tokens: only they stay, equally likely
        return torch.where(s == math.inf, 0.0, -math.inf).double()
    if top == -math.inf:  # nothing is possible by the scores: every token equally (no NaN from -inf - -inf)
        return torch.zeros_like(s)
    return s - top
