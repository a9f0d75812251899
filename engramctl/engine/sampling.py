"""Choosing the next token from logits: penalties and logit_bias, then greedy at temperature 0, else
temperature / min-p / top-k / top-p.

Every option may take any value its schema allows (engine/sampling_params.py), denormals included, and
no combination may give NaN probabilities: the scores are worked in float64, a NaN logit counts as
impossible, infinitely favoured tokens (a positive logit divided by a denormal repeat_penalty) share the
draw, and the best score is shifted to 0 before the temperature divides, so at least one token always
keeps a probability of 1 before normalisation.

Written in numpy, not torch: a token's choice is a dozen small operations, and torch's per-operation
dispatch cost ~0.5-1.5 ms a token more than the arithmetic (issue 18: `chat`'s sampling at 1.18-1.42x
llama-server's ms/token). scripts/bench_sampling.py measures it.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from engramctl.engine.constraint import Constraint
from engramctl.engine.logprobs import TokenLogprob, entry
from engramctl.engine.sampling_params import REPEAT_WINDOW, SamplingParams

if TYPE_CHECKING:
    from engramctl.engine.tokenizer import ChatTokenizer

__all__ = ["Sampler", "SamplingParams", "TokenLogprob", "sample", "scores"]  # SamplingParams: sampling_params.py


class Sampler:
    """One reply's token choice, the per-request object a generation loop holds: its parameters, its own
    random stream, and the recent tokens the penalties look at. `pick` chooses from the logits; `accept`
    says the token is now part of the reply (what a per-token constraint or a logprob record hooks into).

        sampler = Sampler(params, engine.tokenizer, live.token_ids)
        token = sampler.pick(logits); sampler.accept(token)

    With params.logprobs set, `logprobs` holds one TokenLogprob per accepted token, in order.
    """

    def __init__(self, params: SamplingParams, tokenizer: "ChatTokenizer", context: Sequence[int] = ()):
        self.params, self.tokenizer = params, tokenizer
        self._rng = params.generator()
        self._eos = frozenset(tokenizer.eos_ids)
        self._window: deque[int] = deque(context[-REPEAT_WINDOW:], maxlen=REPEAT_WINDOW)  # the state's last tokens
        self._constraint = Constraint(params.grammar, tokenizer) if params.grammar else None  # structured output
        self.logprobs: list[TokenLogprob] = []
        self._picked: TokenLogprob | None = None  # the last pick's entry, recorded once accepted

    def recent(self) -> list[int]:
        """What the penalties look at: the last tokens (prompt and reply so far), never an end-of-turn id
        (the prompt has one: penalising it would keep a reply from ending)."""
        if not self.params.penalizes:
            return []
        return [t for t in self._window if t not in self._eos]

    def pick(self, logits: Any) -> int:
        """logits: (vocab,) float32 (a torch tensor or numpy array), the state's last."""
        if self._constraint is not None:  # structured output: only what the grammar allows next
            logits = self._constraint.mask(_numpy(logits))
        token, self._picked = choose(logits, self.params, self._rng, self.recent(), self.params.logprobs)
        return token if self._constraint is None else self._constraint.choose(token)

    def accept(self, token: int) -> None:
        self._window.append(token)
        if self._picked is not None and self._picked.token == token:
            self.logprobs.append(self._picked)
        self._picked = None
        if self._constraint is not None:
            self._constraint.advance(token)


def sample(logits: Any, params: SamplingParams, rng: np.random.Generator, recent: Sequence[int] = ()) -> int:
    """logits: (vocab,) float32; `recent`: the token ids the penalties look at (oldest first)."""
    return choose(logits, params, rng, recent)[0]


def choose(
    logits: Any, params: SamplingParams, rng: np.random.Generator, recent: Sequence[int] = (), top_n: int | None = None
) -> tuple[int, TokenLogprob | None]:
    """The token, and with `top_n` (top entries wanted, 0 included) its logprob entry (engine/logprobs.py)."""
    values = _numpy(logits)
    if top_n is None and params.temperature == 0 and not params.penalizes:
        # Plain greedy, the API's default at temperature 0, without scores()' float64 passes over the vocabulary
        # (~0.3 ms a token at 49k, on the path every streamed token takes). numpy's argmax takes the first
        # maximum; a NaN would be its answer, and then the general path below decides.
        best = int(values.argmax()) if not params.logit_bias else _greedy_biased(values, params.logit_bias)
        if best >= 0 and not math.isnan(values[best]):
            return best, None
    with np.errstate(all="ignore"):  # once here: infinities and underflow to 0 are expected, and handled
        return _choose(values, params, rng, recent, top_n)


def _choose(
    values: np.ndarray, params: SamplingParams, rng: np.random.Generator, recent: Sequence[int], top_n: int | None
) -> tuple[int, TokenLogprob | None]:
    changed = _changed(values, params, recent)
    # the token ids scored (None: the whole vocabulary); a logprob needs every token's score
    vocab = _candidates(values, params, changed) if top_n is None else None
    s = _scores(values, changed, vocab)
    if params.temperature == 0:
        best = int(np.argmax(s))
        return (best if vocab is None else int(vocab[best])), (None if top_n is None else entry(s, best, top_n, vocab))
    # s <= 0 with a 0 in it, so dividing never makes NaN: a tiny temperature (5e-324 is > 0, so allowed) sends
    # every other score to -inf, which is greedy, as it should be.
    s = s / params.temperature
    at = _draw(s, params, rng)
    return (at if vocab is None else int(vocab[at])), (None if top_n is None else entry(s, at, top_n, vocab))


def _greedy_biased(values: np.ndarray, logit_bias: tuple[tuple[int, float], ...]) -> int:
    """The token the general path picks at temperature 0 with logit_bias and no penalty (the first maximum of
    the biased float64 scores), found without scoring the vocabulary: the best unbiased logit against each
    biased one, those few as Python floats (IEEE doubles, as the general path's float64). -1 where a
    non-finite value is involved: the general path decides those."""
    n = values.size
    ids = [t for t, _ in logit_bias if 0 <= t < n]  # distinct; an id past the logits is the route's to refuse
    best = int(values.argmax())  # the first maximum: the best unbiased logit too unless it is a biased id
    if not ids:
        return best
    biased = {t: x + b for t, x, b in zip(ids, values[ids].tolist(), (b for t, b in logit_bias if 0 <= t < n))}
    if best in biased:
        rest = values.copy()
        rest[ids] = -np.inf
        best = int(rest.argmax()) if len(ids) < n else -1
    top = float(values[best]) if best >= 0 else -math.inf
    if (best >= 0 and not math.isfinite(top)) or not all(map(math.isfinite, biased.values())):
        return -1
    winner = max(biased.values())
    if best >= 0 and top >= winner:  # the lower id wins a tie, as argmax's first maximum
        return min([best] + [t for t, x in biased.items() if x == top])
    return min(t for t, x in biased.items() if x == winner)


def _draw(s: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """A position of `s` (float64 scores over the temperature, best exactly 0) drawn after min-p, top-k, top-p."""
    if params.top_k and params.top_k < s.size:
        pos = _best(s, params.top_k)  # best first: what min-p and top-p keep of it is a prefix
        return int(pos[_draw_few(s[pos].tolist(), params, rng)])
    pos = None  # positions in s of the scores kept, when a cut-off chose some
    if params.min_p > 0:
        # min-p: a token stays when its probability is at least min_p times the best one's (whose score is 0)
        s = np.where(s >= math.log(params.min_p), s, -math.inf)
    if params.top_p < 1.0:
        pos, s = _nucleus(s, params.top_p)
    at = _pick(s, rng)
    return at if pos is None else int(pos[at])


def _draw_few(s: list[float], params: SamplingParams, rng: np.random.Generator) -> int:
    """_draw on the top-k scores, best first, as Python floats: over k of them the ~20 numpy calls of min-p,
    top-p and the draw cost ~10 us each with the caches a decode leaves cold (`chat`'s top_k 40). The same rules;
    math.exp and sequential sums may round a probability's last bit differently from numpy's exp and pairwise
    sums, so a seed drawn exactly on a boundary between two tokens may take the other one."""
    if params.min_p > 0:  # the best (0) stays: log(min_p) <= 0
        floor = math.log(params.min_p)
        s = [x for x in s if x >= floor]
    probs = [math.exp(x) for x in s]  # the best's is 1
    if params.top_p < 1.0:  # a token stays while the ones before it cover less than top_p; the first always
        total, covered = sum(probs), 0.0
        for i, p in enumerate(probs):
            if i and not covered / total < params.top_p:
                probs = probs[:i]
                break
            covered += p
    target, cum = rng.random() * sum(probs), 0.0
    for i, p in enumerate(probs):
        cum += p
        if cum > target:  # never a token of probability 0
            return i
    return max(i for i, p in enumerate(probs) if p > 0)  # target rounded up to the total


_BLOCK = 1024  # scores drawn from in one cumulative sum; more are drawn block by block


def _pick(s: np.ndarray, rng: np.random.Generator) -> int:
    """A position of `s` (float64 scores, best exactly 0), drawn with probability exp(s) / sum(exp(s)); never
    one of probability 0. Over a whole vocabulary (no top-k), exp is taken in float32 (a score under -87 is then
    impossible: a probability under 1e-38 of the best's) and the sums in float64, and the draw finds its block
    of _BLOCK scores before summing within it: a vocabulary-long float64 exp and cumsum cost ~0.5 ms a token."""
    if s.size <= _BLOCK:
        return _within(np.exp(s), rng.random())
    p = np.exp(s.astype(np.float32))
    starts = np.arange(0, s.size, _BLOCK)
    block = _within(np.add.reduceat(p, starts, dtype=np.float64), rng.random())
    return int(starts[block]) + _within(p[starts[block] : starts[block] + _BLOCK], rng.random())


def _within(p: np.ndarray, u: float) -> int:
    """The position where u (in [0, 1)) of the cumulative mass of `p` (non-negative, not all 0) falls."""
    cum = np.cumsum(p, dtype=np.float64)
    at = int(np.searchsorted(cum, u * cum[-1], side="right"))  # never a position of mass 0
    if at >= cum.size:  # u * total rounded up to the total: the last position that has mass
        at = int(np.flatnonzero(p)[-1])
    return at


def _best(s: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k best scores, best first (ties: the lower position first)."""
    pos = np.argpartition(-s, k - 1)[:k]
    return pos[np.lexsort((pos, -s[pos]))]


def _nucleus(s: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Keep a token while the tokens before it (best first) cover less than top_p of the probability; the
    first one always stays. Returns (positions in s, their scores). Sorting only what can be in the nucleus:
    the best 64 scores, then 4x as many until they reach top_p (the vocabulary at worst)."""
    # over a whole vocabulary, as _pick: exp in float32, summed in float64
    total = float(np.exp(s.astype(np.float32)).sum(dtype=np.float64))
    k = min(64, s.size)
    while True:
        at = _best(s, k)
        probs = np.exp(s[at]) / total
        covered = np.cumsum(probs) - probs
        keep = covered < top_p
        if k == s.size or not keep[-1]:
            break
        k = min(4 * k, s.size)
    keep[0] = True  # said, not derived: a top_p of 5e-324 compares as 0 < 0
    at = at[keep]
    return at, s[at]


def _numpy(logits: Any) -> np.ndarray:
    """A (vocab,) array of the logits; a CPU float32 tensor's without a copy."""
    if isinstance(logits, np.ndarray):
        return logits
    try:
        return logits.numpy()  # a CPU tensor's own memory
    except (TypeError, RuntimeError):  # on a GPU, in bfloat16 (which numpy lacks), or requiring grad
        return logits.detach().float().cpu().numpy()


def _candidates(values: np.ndarray, params: SamplingParams, changed: dict[int, float]) -> np.ndarray | None:
    """With top_k, token ids that include every one that can make the top k once penalties and logit_bias
    apply: the tokens they change (`changed`), plus at least the (k + that many) best raw logits. Scoring those
    alone picks the same tokens with the same scores as scoring the vocabulary (~1 ms a token less at 49k on
    `chat`'s sampling). Sorted. None: score everything."""
    n = values.size
    if not params.top_k:
        return None
    k = params.top_k + len(changed)
    if 4 * k >= n:
        return None
    # A threshold no lower than needed, from every stride-th logit: its k-th best leaves at least k logits of
    # the vocabulary at or above it (~stride x k of them), without ordering the vocabulary (a 49k argpartition
    # is most of a token's sampling time).
    sub = values[:: max(1, min(_STRIDE, n // (16 * k)))]
    threshold = np.partition(sub, sub.size - k)[sub.size - k]
    if math.isnan(threshold):
        return None  # NaN counts as largest to numpy: the general path sorts them out
    keep = values >= threshold  # a NaN logit compares False: impossible, as scores() makes it
    if changed:
        keep[np.fromiter(changed, dtype=np.int64, count=len(changed))] = True
    ids = np.flatnonzero(keep)
    return ids if 4 * ids.size < n else None


_STRIDE = 8


def scores(
    logits: Any, params: SamplingParams, recent: Sequence[int] = (), vocab: np.ndarray | None = None
) -> np.ndarray:
    """The logits after the penalties and logit_bias, as float64 scores whose best is exactly 0 and none is
    NaN or +inf (a new array: the caller's logits stay as they are). With `vocab` (sorted token ids holding the
    best scores and every token the penalties and logit_bias change, as _candidates' do), the scores of those
    ids only, in that order."""
    with np.errstate(all="ignore"):
        values = _numpy(logits)
        return _scores(values, _changed(values, params, recent), vocab)


def _changed(values: np.ndarray, params: SamplingParams, recent: Sequence[int]) -> dict[int, float]:
    """token id -> its score after the penalties and logit_bias, for the few tokens they change (the repeat
    window's, the request's logit_bias ids). Worked in Python floats, which are IEEE doubles as float64 arrays
    are, so the scores are the same, without the two dozen numpy calls on small arrays this took (each ~10 us
    with the caches a decode leaves cold: `chat`'s sampling in the daemon went from ~600 to ~520 us a token)."""
    n = values.size
    out: dict[int, float] = {}
    if params.penalizes:
        rp, fp, pp = params.repeat_penalty, params.frequency_penalty, params.presence_penalty
        counts = Counter(recent)
        ids = [t for t in counts if 0 <= t < n]
        for t, x in zip(ids, values[ids].tolist()):
            if rp != 1.0:  # llama.cpp's rule: a positive logit is divided by the penalty, a negative one multiplied
                x = x / rp if x > 0 else x * rp
            out[t] = x - counts[t] * fp - pp  # OpenAI's rule: minus fp per occurrence, minus pp once
    bias = [(t, b) for t, b in params.logit_bias if 0 <= t < n]  # distinct ids; one past the logits is the route's
    if bias:
        for (t, b), x in zip(bias, values[[t for t, _ in bias]].tolist()):
            out[t] = (out[t] if t in out else x) + b
    return out


def _scores(values: np.ndarray, changed: dict[int, float], vocab: np.ndarray | None) -> np.ndarray:
    s = (values if vocab is None else values[vocab]).astype(np.float64)  # a copy, always
    if changed:
        tokens = np.fromiter(changed, dtype=np.int64, count=len(changed))
        at = tokens if vocab is None else np.searchsorted(vocab, tokens)  # each is there: _candidates keeps them
        s[at] = np.fromiter(changed.values(), dtype=np.float64, count=len(changed))
    top = float(s.max())
    if math.isnan(top):  # a maximum is NaN only where a score is, and NaN is impossible
        s[np.isnan(s)] = -math.inf
        top = float(s.max())
    if top == math.inf:  # infinitely favoured tokens: only they stay, equally likely
        return np.where(s == math.inf, 0.0, -math.inf)
    if top == -math.inf:  # nothing is possible by the scores: every token equally (no NaN from -inf - -inf)
        return np.zeros_like(s)
    s -= top
    return s
