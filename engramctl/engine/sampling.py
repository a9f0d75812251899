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
from collections import Counter, deque
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from engramctl.engine.constraint import Constraint
from engramctl.engine.sampling_params import REPEAT_WINDOW, SamplingParams

if TYPE_CHECKING:
    from engramctl.engine.tokenizer import ChatTokenizer

__all__ = ["Sampler", "SamplingParams", "sample", "scores"]  # SamplingParams is torch-free: sampling_params.py


class Sampler:
    """One reply's token choice, the per-request object a generation loop holds: its parameters, its own
    random stream, and the recent tokens the penalties look at. `pick` chooses from the logits; `accept`
    says the token is now part of the reply (what a per-token constraint or a logprob record hooks into).

        sampler = Sampler(params, engine.tokenizer, live.token_ids)
        token = sampler.pick(logits); sampler.accept(token)
    """

    def __init__(self, params: SamplingParams, tokenizer: "ChatTokenizer", context: Sequence[int] = ()):
        self.params, self.tokenizer = params, tokenizer
        self._rng = params.generator()
        self._eos = frozenset(tokenizer.eos_ids)
        self._window: deque[int] = deque(context[-REPEAT_WINDOW:], maxlen=REPEAT_WINDOW)  # the state's last tokens
        self._constraint = Constraint(params.grammar, tokenizer) if params.grammar else None  # structured output

    def recent(self) -> list[int]:
        """What the penalties look at: the last tokens (prompt and reply so far), never an end-of-turn id
        (the prompt has one: penalising it would keep a reply from ending)."""
        if not self.params.penalizes:
            return []
        return [t for t in self._window if t not in self._eos]

    def pick(self, logits: torch.Tensor) -> int:
        """logits: (vocab,) float32, the state's last."""
        if self._constraint is None:
            return sample(logits, self.params, self._rng, self.recent())
        return self._constraint.choose(sample(self._constraint.mask(logits), self.params, self._rng, self.recent()))

    def accept(self, token: int) -> None:
        self._window.append(token)
        if self._constraint is not None:
            self._constraint.advance(token)


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
    vocab = _candidates(logits, params, recent)  # the token ids scored; None: the whole vocabulary
    s = scores(logits, params, recent, vocab)
    if params.temperature == 0:
        best = int(torch.argmax(s))
        return best if vocab is None else int(vocab[best])
    # s <= 0 with a 0 in it, so dividing never makes NaN: a tiny temperature (5e-324 is > 0, so allowed) sends
    # every other score to -inf, which is greedy, as it should be.
    s = s / params.temperature
    if params.min_p > 0:
        # min-p: a token stays when its probability is at least min_p times the best one's (whose score is 0)
        s = torch.where(s >= math.log(params.min_p), s, -math.inf)
    s = s.float()
    ids, ordered = vocab, False  # token ids of `s` (None: positions are ids); whether s is sorted, best first
    if params.top_k and params.top_k < s.numel():
        # the k best only, sorted: top-p below then sorts k scores, not the vocabulary (~2 ms a token at 49k)
        s, pos = torch.topk(s, params.top_k)
        ids, ordered = (pos if ids is None else ids[pos]), True
    if params.top_p < 1.0:
        if not ordered:
            s, pos = torch.sort(s, descending=True)
            ids = pos if ids is None else ids[pos]
        probs = torch.softmax(s, dim=-1)
        # keep a token while the tokens before it cover less than top_p; the first one always stays
        keep = (torch.cumsum(probs, dim=-1) - probs) < params.top_p
        keep[0] = True  # said, not derived: a top_p under float32's smallest (5e-324) compares as 0 < 0
        s, ids = s[keep], ids[keep]
    pick = int(torch.multinomial(torch.softmax(s, dim=-1), 1, generator=generator))
    return pick if ids is None else int(ids[pick])


def _candidates(logits: torch.Tensor, params: SamplingParams, recent: Sequence[int]) -> torch.Tensor | None:
    """With top_k, the ids that can make the top k once penalties and logit_bias apply: the tokens they change,
    plus the (k + that many) best raw logits. Scoring those alone picks the same tokens with the same scores
    as scoring the vocabulary (~1 ms a token less at 49k on `chat`'s sampling). None: score everything."""
    n = logits.numel()
    if not params.top_k or logits.device.type != "cpu":
        return None
    changed = {t for t in recent if 0 <= t < n} if params.penalizes else set()
    changed.update(t for t, _ in params.logit_bias if 0 <= t < n)
    k = params.top_k + len(changed)
    if 4 * k >= n:
        return None
    values = logits.numpy()
    best = np.argpartition(values, n - k)[n - k :]  # the k largest; NaN counts as largest to numpy
    if np.isnan(values[best]).any():
        return None  # so NaNs may have pushed real candidates out: the general path sorts them out
    return torch.from_numpy(np.union1d(best, np.fromiter(changed, dtype=np.int64, count=len(changed))))


def scores(
    logits: torch.Tensor, params: SamplingParams, recent: Sequence[int] = (), vocab: torch.Tensor | None = None
) -> torch.Tensor:
    """The logits after the penalties and logit_bias, as float64 scores whose best is exactly 0 and none is
    NaN or +inf (a new tensor: the caller's logits stay as they are). With `vocab` (token ids holding the best
    scores, _candidates), the scores of those ids only, in that order."""
    n = logits.numel()
    s = (logits if vocab is None else logits[vocab]).to("cpu", torch.float64, copy=True)
    at = None if vocab is None else {t: i for i, t in enumerate(vocab.tolist())}  # token id -> position in s
    if params.penalizes and recent:
        counts = Counter(t for t in recent if 0 <= t < n and (at is None or t in at))
        if counts:
            tokens = sorted(counts)
            ids = torch.tensor(tokens if at is None else [at[t] for t in tokens], dtype=torch.long)
            seen = s[ids]
            if params.repeat_penalty != 1.0:
                # llama.cpp's rule: a positive logit is divided by the penalty, a negative one multiplied
                seen = torch.where(seen > 0, seen / params.repeat_penalty, seen * params.repeat_penalty)
            # OpenAI's rule: minus frequency_penalty per occurrence, minus presence_penalty once
            times = torch.tensor([counts[t] for t in tokens], dtype=torch.float64)
            seen = seen - times * params.frequency_penalty - params.presence_penalty
            s[ids] = seen
    for token, bias in params.logit_bias:
        if token < n and (at is None or token in at):  # an id past the logits is the route's to refuse
            s[token if at is None else at[token]] += bias
    s = torch.where(torch.isnan(s), -math.inf, s)
    top = float(s.max())
    if top == math.inf:  # infinitely favoured tokens: only they stay, equally likely
        return torch.where(s == math.inf, 0.0, -math.inf).double()
    if top == -math.inf:  # nothing is possible by the scores: every token equally (no NaN from -inf - -inf)
        return torch.zeros_like(s)
    return s - top
