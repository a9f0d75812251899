import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engramctl.engine.sampling import SamplingParams, sample, scores
from engramctl.errors import UsageError


def test_temperature_zero_is_argmax():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert sample(logits, SamplingParams(temperature=0), np.random.default_rng()) == 1


def test_seed_makes_sampling_repeatable():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(temperature=1.0, seed=7)
    a = [sample(logits, p, g) for g in [p.generator()] for _ in range(20)]
    b = [sample(logits, p, g) for g in [p.generator()] for _ in range(20)]
    assert a == b and len(set(a)) > 1


def test_top_k_one_is_greedy_and_top_p_keeps_the_head():
    logits = torch.tensor([0.0, 5.0, 4.0, 1.0])
    g = np.random.default_rng(0)
    assert {sample(logits, SamplingParams(temperature=1.0, top_k=1), g) for _ in range(20)} == {1}
    # token 1 holds ~73% of the mass: top_p=0.5 keeps only it
    assert {sample(logits, SamplingParams(temperature=1.0, top_p=0.5), g) for _ in range(20)} == {1}
    seen = {sample(logits, SamplingParams(temperature=1.0, top_p=0.99), g) for _ in range(200)}
    assert {1, 2} <= seen


@pytest.mark.parametrize("kw", [{"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -2}, {"max_tokens": 0}])
def test_invalid_params_raise_typed_error(kw):
    with pytest.raises(UsageError):
        SamplingParams(**kw)


def test_top_k_and_top_p_sample_only_within_both():
    logits = torch.randn(5000, generator=torch.Generator().manual_seed(1)) * 3
    g = np.random.default_rng(0)
    best = torch.argsort(logits, descending=True)
    probs = torch.softmax(logits[best[:40]], dim=-1)
    covered = int(((torch.cumsum(probs, dim=-1) - probs) < 0.9).sum())  # the nucleus inside the top 40
    allowed = set(best[:covered].tolist())
    seen = {sample(logits, SamplingParams(temperature=1.0, top_k=40, top_p=0.9), g) for _ in range(500)}
    assert seen <= allowed and len(seen) > 1


def test_a_tiny_temperature_or_top_p_samples_the_best_token():
    """Regression (issue 12 API fuzz): temperature or top_p 5e-324 is > 0, so the API allows it; float32 rounded
    it to 0 (NaN scores; no token kept) and the daemon answered 500 (multinomial on NaN or on nothing)."""
    import torch

    from engramctl.engine.sampling import SamplingParams, sample

    logits = torch.randn(512, generator=torch.Generator().manual_seed(3))
    for temperature in (5e-324, 1e-300, 1e-40):
        for cut in ({}, {"top_p": 0.5}, {"top_k": 3}, {"top_k": 3, "top_p": 0.1}):
            params = SamplingParams(temperature=temperature, **cut)
            assert sample(logits, params, np.random.default_rng(0)) == int(logits.argmax())
    for top_p in (5e-324, 1e-300):  # the same for a top_p float32 rounds to 0: the best token always stays
        for temperature in (0.7, 5e-324):
            params = SamplingParams(temperature=temperature, top_p=top_p)
            assert sample(logits, params, np.random.default_rng(0)) == int(logits.argmax())


def test_repeat_penalty_follows_llama_cpps_rule_and_only_touches_recent_tokens():
    logits = torch.tensor([2.0, 1.9, -1.0, -1.1])
    off = SamplingParams(temperature=0)
    on = SamplingParams(temperature=0, repeat_penalty=1.5)
    g = np.random.default_rng()
    assert sample(logits, off, g, recent=[0]) == 0  # 1.0: no penalty whatever the history
    assert sample(logits, on, g, recent=[0]) == 1  # 2.0 / 1.5 < 1.9
    assert sample(logits, on, g, recent=[3]) == 0  # a token not in the window keeps its logit
    neg = torch.tensor([-1.0, -1.2])
    assert sample(neg, on, g, recent=[0]) == 1  # negative: multiplied, -1.5 < -1.2
    assert torch.equal(logits, torch.tensor([2.0, 1.9, -1.0, -1.1]))  # the caller's logits untouched


def test_min_p_keeps_only_tokens_near_the_best():
    logits = torch.tensor([0.0, 5.0, 4.5, 1.0])  # p(2)/p(1) = e^-0.5 ~ 0.61, p(3)/p(1) ~ 0.018
    g = np.random.default_rng(0)
    seen = {sample(logits, SamplingParams(temperature=1.0, min_p=0.5), g) for _ in range(200)}
    assert seen == {1, 2}
    assert {sample(logits, SamplingParams(temperature=1.0, min_p=1.0), g) for _ in range(50)} == {1}
    assert {sample(logits, SamplingParams(temperature=1.0, min_p=5e-324), g) for _ in range(400)} == {0, 1, 2, 3}


def test_presence_and_frequency_penalties_follow_openais_rule():
    logits = torch.tensor([2.0, 1.5, 1.2])
    g = np.random.default_rng()
    greedy = dict(temperature=0)
    assert sample(logits, SamplingParams(presence_penalty=0.6, **greedy), g, recent=[0]) == 1  # 2.0 - 0.6 < 1.5
    assert sample(logits, SamplingParams(presence_penalty=0.4, **greedy), g, recent=[0, 0, 0]) == 0  # once, not per use
    assert sample(logits, SamplingParams(frequency_penalty=0.3, **greedy), g, recent=[0, 0]) == 1  # 2.0 - 2 * 0.3
    assert sample(logits, SamplingParams(frequency_penalty=0.3, **greedy), g, recent=[0]) == 0  # 1.7 > 1.5
    assert sample(logits, SamplingParams(presence_penalty=-2, **greedy), g, recent=[2]) == 2  # negative: favoured
    s = scores(logits, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), recent=[1, 1, 2])
    assert np.allclose(s, np.array([2.0, 1.5 - 0.5 - 0.5, 1.2 - 0.5 - 0.25]) - 2.0)


def test_logit_bias_adds_to_the_logit_and_minus_100_bans():
    logits = torch.tensor([3.0, 0.0, -1.0])
    g = np.random.default_rng(0)
    assert sample(logits, SamplingParams.from_options({"temperature": 0, "logit_bias": {"2": 4.5}}), g) == 2
    banned = SamplingParams.from_options({"temperature": 1.0, "logit_bias": {"0": -100}})
    assert 0 not in {sample(logits, banned, g) for _ in range(200)}
    past = SamplingParams.from_options({"temperature": 0, "logit_bias": {"99": 100}})  # no such token: no effect
    assert sample(logits, past, g) == 0


@pytest.mark.parametrize(
    "kw, named",
    [
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": float("inf")}, "top_p"),
        ({"repeat_penalty": -1.0}, "repeat_penalty"),
        ({"repeat_penalty": 0.0}, "repeat_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": float("-inf")}, "frequency_penalty"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"-3": 1}}, "logit_bias"),
        ({"logit_bias": {"1": float("nan")}}, "logit_bias"),
        ({"top_k": 2.5}, "top_k"),
    ],
)
def test_an_out_of_domain_option_is_a_usage_error_naming_it(kw, named):
    with pytest.raises(UsageError, match=named):
        SamplingParams.from_options(kw)


def test_a_denormal_repeat_penalty_samples_instead_of_nan():
    """Regression (issue 20): repeat_penalty 5e-324 divided a positive logit of a recent token to +inf; the
    shift by the best score then made inf - inf = NaN and torch.multinomial raised (a 500 on the API)."""
    logits = torch.tensor([2.0, 1.0, -3.0, 0.5])
    for temperature in (0.0, 0.7, 5e-324, 2.0):
        params = SamplingParams(temperature=temperature, repeat_penalty=5e-324, top_p=0.9, top_k=3)
        picks = {sample(logits, params, np.random.default_rng(s), recent=[1, 3]) for s in range(30)}
        assert picks <= {1, 3}  # infinitely favoured: only they can come (positive logits divided by ~0)
    neg = torch.tensor([-2.0, -1.0])  # a negative logit multiplied by ~0 becomes ~0: the best
    assert sample(neg, SamplingParams(temperature=0, repeat_penalty=5e-324), np.random.default_rng(), recent=[0]) == 0


def test_huge_seeds_and_negative_seeds_are_seeds():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    for seed in (-1, 2**63, -(2**70), 10**30):
        p = SamplingParams(temperature=1.0, seed=seed)
        assert [sample(logits, p, g) for g in [p.generator()] for _ in range(5)] == [
            sample(logits, p, g) for g in [p.generator()] for _ in range(5)
        ]


_finite = st.floats(allow_nan=False, allow_infinity=False)


def _in(lo, hi, *, open_lo=False):
    """Floats of [lo, hi] (or (lo, hi]), denormals, both ends and values just inside them included."""
    return st.one_of(
        st.floats(lo, hi, exclude_min=open_lo, allow_subnormal=True),
        st.sampled_from([x for x in (lo, hi, 5e-324, 1e-308, 1.0) if (lo < x if open_lo else lo <= x) and x <= hi]),
    )


PARAMS = st.fixed_dictionaries(
    {},
    optional={
        "temperature": _in(0, 2),
        "top_p": _in(0, 1, open_lo=True),
        "top_k": st.integers(0, 10**12),
        "min_p": _in(0, 1),
        "repeat_penalty": _in(0, 2, open_lo=True),
        "presence_penalty": _in(-2, 2),
        "frequency_penalty": _in(-2, 2),
        "seed": st.integers(-(2**80), 2**80),
        "logit_bias": st.dictionaries(st.integers(0, 70).map(str), _in(-100, 100), max_size=6),
    },
)
LOGITS = st.lists(
    st.one_of(_finite, st.sampled_from([float("inf"), float("-inf"), float("nan"), 5e-324, -5e-324])),
    min_size=1,
    max_size=64,
)


@settings(max_examples=400, deadline=None, database=None, derandomize=True)
@given(PARAMS, LOGITS, st.lists(st.integers(0, 70), max_size=20))
def test_any_options_on_any_logits_sample_a_token(options, logits, recent):
    """The whole domain of every option, on logits that may hold infinities, NaN and denormals: a token of the
    vocabulary comes out, never an exception (the engine's half of 'never a 5xx')."""
    params = SamplingParams.from_options(options)
    t = torch.tensor(logits, dtype=torch.float32)
    s = scores(t, params, recent)
    assert not np.isnan(s).any() and float(s.max()) == 0.0
    token = sample(t, params, np.random.default_rng(0), recent)
    assert 0 <= token < len(logits)
    assert s[token] > -math.inf  # never a token the scores rule out


@pytest.mark.parametrize(
    "values",
    [
        [0.5, 2.0, 2.0, -1.0],  # a tie: the first maximum, as torch.argmax
        [float("nan"), 1.0, 3.0, float("nan")],  # NaN is impossible, not the best
        [float("-inf")] * 4,
        [1.0, float("inf"), 0.0, float("inf")],
        [float("nan")] * 3,
    ],
)
def test_plain_greedy_takes_the_token_the_general_path_takes(values):
    logits = torch.tensor(values, dtype=torch.float32)
    plain = SamplingParams(temperature=0.0)
    assert sample(logits, plain, plain.generator()) == int(np.argmax(scores(logits, plain)))


@settings(max_examples=400, deadline=None, database=None, derandomize=True)
@given(
    st.lists(
        st.one_of(st.sampled_from([0.0, 1.0, 2.0, -3.5, 99.0]), LOGITS.map(lambda v: v[0])), min_size=1, max_size=12
    ),
    st.dictionaries(st.integers(0, 15), st.sampled_from([-100.0, -1.0, 0.0, 1.0, 2.0, 97.0, 100.0]), max_size=6),
)
def test_greedy_with_logit_bias_takes_the_token_the_general_path_takes(values, bias):
    """Greedy with logit_bias skips scoring the vocabulary (the bench bans end tokens that way on every
    token): the same token as the general path's first maximum, ties, ids past the vocabulary and
    non-finite logits included."""
    from unittest import mock

    import engramctl.engine.sampling as sampling

    with np.errstate(over="ignore"):  # a float64 past float32's range is an infinite logit
        logits = np.array(values, dtype=np.float32)
    params = SamplingParams(temperature=0.0, logit_bias=tuple(sorted(bias.items())))
    fast = sample(logits, params, params.generator())
    with mock.patch.object(sampling, "_greedy_biased", lambda *_a: -1):  # -1: the general path decides
        full = sample(logits, params, params.generator())
    assert fast == full == int(np.argmax(scores(logits, params)))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    top_k=st.integers(1, 60),
    top_p=st.sampled_from([1.0, 0.9, 0.5]),
    min_p=st.sampled_from([0.0, 0.05]),
    temperature=st.sampled_from([0.0, 0.3, 0.8, 1.5]),
    repeat_penalty=st.sampled_from([1.0, 1.1, 0.7]),
    presence=st.sampled_from([0.0, 0.5, -1.0]),
    bias=st.lists(st.tuples(st.integers(0, 1999), st.floats(-100, 100)), max_size=4, unique_by=lambda b: b[0]),
)
def test_scoring_only_the_candidates_draws_what_scoring_the_vocabulary_draws(
    seed, top_k, top_p, min_p, temperature, repeat_penalty, presence, bias
):
    from unittest import mock

    import engramctl.engine.sampling as sampling

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2000, generator=g) * 4
    recent = torch.randint(0, 2000, (64,), generator=g).tolist()
    params = SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repeat_penalty=repeat_penalty,
        presence_penalty=presence,
        logit_bias=tuple(bias),
        seed=seed,
    )
    assert sampling._candidates(logits.numpy(), params, recent) is not None
    fast = [sample(logits, params, gen, recent) for gen in [params.generator()] for _ in range(3)]
    with mock.patch.object(sampling, "_candidates", lambda *_a: None):
        full = [sample(logits, params, gen, recent) for gen in [params.generator()] for _ in range(3)]
    assert fast == full


def test_a_sampler_penalises_what_it_accepted_and_never_an_end_of_turn_id():
    from engramctl.engine.sampling import Sampler

    logits = torch.tensor([0.0, 2.0, 1.9, 0.5])

    class Tokenizer:  # what a Sampler reads of a ChatTokenizer here
        eos_ids = frozenset({3})

    sampler = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0), Tokenizer(), context=[3, 0])
    assert sampler.recent() == [0]  # the prompt's end-of-turn id is not penalised
    first = sampler.pick(logits)
    assert first == 1
    sampler.accept(first)
    assert sampler.recent() == [0, 1]
    assert sampler.pick(logits) == 2  # 2.0 / 2 = 1.0 < 1.9: the accepted token lost its lead


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    logits=st.lists(st.floats(width=32), min_size=8, max_size=8),  # NaN, infinities, denormals and -0.0 included
    recent=st.lists(st.integers(0, 9), max_size=12),  # 8 and 9 are past the logits
    repeat_penalty=st.sampled_from([1.0, 1.1, 0.7, 2.0, 5e-324]),
    presence=st.sampled_from([0.0, 0.5, -2.0]),
    frequency=st.sampled_from([0.0, 0.25, 2.0]),
    bias=st.lists(st.tuples(st.integers(0, 9), st.floats(-100, 100)), max_size=3, unique_by=lambda b: b[0]),
)
def test_the_scores_the_penalties_change_are_float64_array_arithmetic(
    logits, recent, repeat_penalty, presence, frequency, bias
):
    """sampling._changed works in Python floats; the same rules on float64 arrays give the same bits."""
    from collections import Counter

    from engramctl.engine.sampling import _changed

    values = np.array(logits, dtype=np.float32)
    params = SamplingParams(
        repeat_penalty=repeat_penalty, presence_penalty=presence, frequency_penalty=frequency, logit_bias=tuple(bias)
    )
    s = values.astype(np.float64)
    counts = Counter(t for t in recent if t < 8) if params.penalizes else Counter()
    if counts:
        tokens = np.array(list(counts), dtype=np.int64)
        times = np.array(list(counts.values()), dtype=np.float64)
        seen = s[tokens]
        with np.errstate(all="ignore"):
            if repeat_penalty != 1.0:
                seen = np.where(seen > 0, seen / repeat_penalty, seen * repeat_penalty)
            s[tokens] = seen - times * frequency - presence
    inside = [(t, b) for t, b in bias if t < 8]
    with np.errstate(all="ignore"):
        for t, b in inside:
            s[t] += b
    expected = {t: s[t] for t in set(counts) | {t for t, _ in inside}}
    got = _changed(values, params, recent)
    assert got.keys() == expected.keys()
    assert np.array(list(got.values())).tobytes() == np.array([expected[t] for t in got]).tobytes()


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(
    rest=st.lists(st.one_of(st.floats(-40, 0), st.just(-math.inf)), max_size=63),
    top_p=st.sampled_from([1.0, 0.95, 0.9, 0.5, 5e-324]),
    min_p=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_drawing_from_the_top_k_in_python_floats_follows_the_array_rules(rest, top_p, min_p, seed):
    """sampling._draw_few (the top-k's min-p, top-p and draw on Python floats) takes the token the numpy path
    takes on the same scores (best first, the best exactly 0, -inf where a tiny temperature sent them)."""
    from engramctl.engine import sampling

    s = [0.0] + sorted(rest, reverse=True)
    params = SamplingParams(temperature=1.0, top_p=top_p, min_p=min_p)  # top_k 0: _draw's array path
    few = sampling._draw_few(s, params, np.random.default_rng(seed))
    with np.errstate(all="ignore"):
        full = sampling._draw(np.array(s), params, np.random.default_rng(seed))
    assert few == full
