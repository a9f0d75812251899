"""Token log-probabilities (OpenAI's `logprobs`): one entry per reply token, taken where it was sampled.

A token's logprob is the log-softmax of the scores it was drawn from: the logits after the penalties and
logit_bias and divided by the temperature, before min-p, top-k and top-p cut the candidates (OpenAI's
definition; at temperature 0 the scores themselves). So a token the cut-offs removed still has its
probability, and a reply's logprobs describe the model rather than the sampler's truncation.
The wire shapes (token text, bytes) are the daemon's: daemon/logprobs_json.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A probability that rounds to nothing in float64 is -inf, which JSON cannot carry: OpenAI writes -9999.0.
FLOOR = -9999.0


@dataclass(frozen=True)
class TokenLogprob:
    """One sampled token: its id, its logprob, and the `top` most likely ids of the same draw with theirs
    (best first; ties by id, so at temperature 0 the first is the greedy token)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def entry(scores: np.ndarray, token_at: int, top_n: int, ids: np.ndarray | None = None) -> TokenLogprob:
    """The entry of the token at position `token_at` of `scores` (float64, best exactly 0, none NaN: what
    sampling.scores gives, divided by the temperature). `ids`: the token id of each position (None: the
    positions are the ids)."""
    with np.errstate(under="ignore"):
        total = float(np.exp(scores).sum())  # >= 1: the best score is 0
    norm = float(np.log(total))
    top: tuple[tuple[int, float], ...] = ()
    if top_n > 0:
        n = min(top_n, scores.size)
        pos = np.argpartition(-scores, n - 1)[:n] if n < scores.size else np.arange(scores.size)
        token_ids = pos if ids is None else ids[pos]
        order = np.lexsort((token_ids, -scores[pos]))  # best first, then the lower id (argmax's tie rule)
        top = tuple((int(token_ids[i]), _logprob(scores[pos[i]], norm)) for i in order)
    token = token_at if ids is None else int(ids[token_at])
    return TokenLogprob(int(token), _logprob(scores[token_at], norm), top)


def _logprob(score: float, norm: float) -> float:
    value = float(score) - norm  # <= 0: score <= 0 <= norm
    return max(value, FLOOR)
