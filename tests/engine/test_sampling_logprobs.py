"""Token logprobs where they are taken (engine/sampling.py's choose, engine/logprobs.py): the log-softmax of the
scores a token was drawn from (penalties and logit_bias applied, divided by the temperature, before min-p /
top-k / top-p), checked against torch's log_softmax; asking for them never changes the token drawn; a
generation's pieces carry exactly the entries its Finish holds, end-of-turn excluded."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engramctl.engine.logprobs import FLOOR
from engramctl.engine.sampling import Sampler, SamplingParams, choose, scores


def reference(logits: list[float], params: SamplingParams, recent=()) -> torch.Tensor:
    """log_softmax of the penalised logits over the temperature, by torch, in float64."""
    s = torch.from_numpy(scores(torch.tensor(logits), params, recent))
    return torch.log_softmax(s / (params.temperature or 1.0), dim=-1)


def test_the_logprob_is_over_the_whole_vocabulary_before_top_k_and_top_p():
    logits = [2.0, 1.0, 0.5, -1.0, 3.0]
    params = SamplingParams(temperature=0.7, top_k=2, top_p=0.5, repeat_penalty=1.3, logit_bias=((3, 1.5),), seed=3)
    ref = reference(logits, params, recent=[0, 4])
    for seed in range(20):
        token, e = choose(torch.tensor(logits), params, np.random.default_rng(seed), [0, 4], top_n=5)
        assert e.token == token
        assert e.logprob == pytest.approx(float(ref[token]), abs=1e-12)  # not renormalised over the 2 kept
        assert [t for t, _ in e.top] == torch.argsort(ref, descending=True).tolist()
        assert [lp for _, lp in e.top] == pytest.approx(sorted(ref.tolist(), reverse=True), abs=1e-12)


def test_at_temperature_zero_the_logprobs_are_the_plain_logits_and_the_greedy_token_leads():
    logits = [0.5, 2.0, 2.0, -1.0, 1.5]  # a tie: the first maximum is the greedy token, and leads
    params = SamplingParams(temperature=0.0, presence_penalty=0.25)
    token, e = choose(torch.tensor(logits), params, np.random.default_rng(0), [4], top_n=3)
    assert token == 1 and e.top[0][0] == 1 and e.top[1][0] == 2
    ref = reference(logits, params, recent=[4])
    assert e.logprob == pytest.approx(float(ref[1]), abs=1e-12)
    assert e.top[2] == (4, pytest.approx(float(ref[4]), abs=1e-12))  # 1.5 - 0.25 = 1.25 > 0.5


def test_an_impossible_token_is_floored_not_minus_infinity():
    logits = [float("-inf"), 1.0, float("nan"), 0.0]
    _, e = choose(torch.tensor(logits), SamplingParams(temperature=1.0), np.random.default_rng(0), top_n=4)
    values = [lp for _, lp in e.top]
    assert values[-2:] == [FLOOR, FLOOR] and all(math.isfinite(v) and v <= 0 for v in values)


_logit = st.one_of(
    st.floats(-1e30, 1e30), st.sampled_from([float("inf"), float("-inf"), float("nan"), 5e-324, -5e-324])
)


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(
    logits=st.lists(_logit, min_size=1, max_size=64),
    temperature=st.sampled_from([0.0, 5e-324, 0.3, 1.0, 2.0]),
    top_k=st.sampled_from([0, 1, 3]),
    top_p=st.sampled_from([1.0, 0.5, 5e-324]),
    min_p=st.sampled_from([0.0, 0.2]),
    repeat_penalty=st.sampled_from([1.0, 1.3, 5e-324]),
    top_n=st.integers(0, 20),
    recent=st.lists(st.integers(0, 70), max_size=10),
)
def test_asking_for_logprobs_changes_no_draw_and_gives_sorted_finite_entries(
    logits, temperature, top_k, top_p, min_p, repeat_penalty, top_n, recent
):
    params = SamplingParams(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty
    )
    t = torch.tensor(logits, dtype=torch.float32)
    plain, none = choose(t, params, np.random.default_rng(5), recent)
    token, e = choose(t, params, np.random.default_rng(5), recent, top_n=top_n)
    assert none is None and token == plain and e.token == token
    assert math.isfinite(e.logprob) and e.logprob <= 0
    values = [lp for _, lp in e.top]
    assert len(values) == min(top_n, len(logits)) and values == sorted(values, reverse=True)
    assert all(math.isfinite(v) and v <= 0 for v in values)
    if values and temperature == 0:
        assert e.top[0][0] == token


def test_a_sampler_records_one_entry_per_accepted_token():
    class Tokenizer:
        eos_ids = frozenset({3})

    sampler = Sampler(SamplingParams(temperature=0.9, seed=1, logprobs=2), Tokenizer())
    logits = torch.tensor([0.0, 2.0, 1.9, 0.5])
    picked = []
    for _ in range(5):
        picked.append(sampler.pick(logits))
        sampler.accept(picked[-1])
    assert [e.token for e in sampler.logprobs] == picked and all(len(e.top) == 2 for e in sampler.logprobs)
    off = Sampler(SamplingParams(temperature=0.9, seed=1), Tokenizer())
    off.accept(off.pick(logits))
    assert off.logprobs == []


def test_a_generations_pieces_carry_the_entries_its_finish_holds(tiny_engine):
    engine = tiny_engine("transformers")
    live = engine.new_live()
    engine.prefill(live, engine.tokenizer.encode(engine.tokenizer.render([{"role": "user", "content": "Hello"}])))
    params = SamplingParams(temperature=1.0, seed=11, max_tokens=24, logprobs=1)
    gen = engine.generate(live, params)
    pieces = list(gen)
    finish = gen.finish
    carried = [e for p in pieces for e in p.logprobs]
    assert carried == list(finish.logprobs[: len(carried)]) and finish.logprobs
    eos = finish.reason == "stop" and finish.pending in engine.tokenizer.eos_ids
    assert [e.token for e in finish.logprobs] == list(finish.token_ids[: len(finish.token_ids) - eos])
    assert "".join(pieces) == finish.text
    engine.release(live)
