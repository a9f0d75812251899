import pytest
import torch

from engramctl.engine.sampling import SamplingParams, sample
from engramctl.errors import UsageError


def test_temperature_zero_is_argmax():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert sample(logits, SamplingParams(temperature=0), torch.Generator()) == 1


def test_seed_makes_sampling_repeatable():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(temperature=1.0, seed=7)
    a = [sample(logits, p, g) for g in [p.generator()] for _ in range(20)]
    b = [sample(logits, p, g) for g in [p.generator()] for _ in range(20)]
    assert a == b and len(set(a)) > 1


def test_top_k_one_is_greedy_and_top_p_keeps_the_head():
    logits = torch.tensor([0.0, 5.0, 4.0, 1.0])
    g = torch.Generator().manual_seed(0)
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
    g = torch.Generator().manual_seed(0)
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
            assert sample(logits, params, torch.Generator().manual_seed(0)) == int(logits.argmax())
    for top_p in (5e-324, 1e-300):  # the same for a top_p float32 rounds to 0: the best token always stays
        for temperature in (0.7, 5e-324):
            params = SamplingParams(temperature=temperature, top_p=top_p)
            assert sample(logits, params, torch.Generator().manual_seed(0)) == int(logits.argmax())


def test_repeat_penalty_follows_llama_cpps_rule_and_only_touches_recent_tokens():
    logits = torch.tensor([2.0, 1.9, -1.0, -1.1])
    off = SamplingParams(temperature=0)
    on = SamplingParams(temperature=0, repeat_penalty=1.5)
    g = torch.Generator()
    assert sample(logits, off, g, recent=[0]) == 0  # 1.0: no penalty whatever the history
    assert sample(logits, on, g, recent=[0]) == 1  # 2.0 / 1.5 < 1.9
    assert sample(logits, on, g, recent=[3]) == 0  # a token not in the window keeps its logit
    neg = torch.tensor([-1.0, -1.2])
    assert sample(neg, on, g, recent=[0]) == 1  # negative: multiplied, -1.5 < -1.2
    assert torch.equal(logits, torch.tensor([2.0, 1.9, -1.0, -1.1]))  # the caller's logits untouched
