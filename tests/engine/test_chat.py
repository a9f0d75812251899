"""Chat turns as token deltas, on real tiny models with an offline ChatML tokenizer."""

from __future__ import annotations

import threading

import pytest
import torch

from engramctl.engine.chat import is_prefix_stable, token_delta
from engramctl.engine.engine import Engine
from engramctl.engine.sampling import SamplingParams

HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is a Mamba layer? Ünïcødé 日本"},
    {"role": "assistant", "content": "A selective state-space block."},
]
NEW = [{"role": "user", "content": "And attention?"}]


@pytest.fixture(scope="module")
def engine(zoo, load_backend):
    backend = load_backend(zoo.path("granitemoehybrid"))
    return Engine(backend, backend.tokenizer)


@pytest.fixture(scope="module")
def unstable_engine(zoo, load_backend):
    backend = load_backend(zoo.path("granitemoehybrid", template="unstable"))
    return Engine(backend, backend.tokenizer)


def test_token_delta_extends_history_tokens(engine):
    tok = engine.tokenizer
    delta = token_delta(tok, HISTORY, NEW)
    assert delta
    full = tok.encode(tok.render(HISTORY + NEW, add_generation_prompt=True))
    assert full == tok.encode(tok.render(HISTORY, add_generation_prompt=False)) + delta
    assert tok.decode(delta, skip_special=False).endswith("<|im_start|>assistant\n")


def test_non_prefix_stable_template_is_detected(engine, unstable_engine):
    assert is_prefix_stable(engine.tokenizer) and engine.prefix_stable
    assert not is_prefix_stable(unstable_engine.tokenizer) and not unstable_engine.prefix_stable
    assert token_delta(unstable_engine.tokenizer, HISTORY, NEW) is None


def _greedy(max_tokens=6, **kw):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def test_second_turn_feeds_only_the_delta_and_matches_a_full_prefill(engine):
    live, fed1 = engine.feed_messages(engine.new_live(), HISTORY[:2])
    assert fed1.computed_tokens == fed1.prompt_tokens and not fed1.reset
    gen = engine.generate(live, _greedy())
    reply = "".join(gen)
    engine.settle(live, gen)
    assert live.token_ids[-len(gen.finish.token_ids) :] == list(gen.finish.token_ids)  # pending token fed
    messages = HISTORY[:2] + [{"role": "assistant", "content": reply}] + NEW
    before = len(live.token_ids)
    live, fed2 = engine.feed_messages(live, messages)
    assert not fed2.reset
    assert fed2.computed_tokens == len(live.token_ids) - before < fed2.prompt_tokens
    assert live.text == engine.tokenizer.render(messages, add_generation_prompt=True)
    fresh = engine.new_live()
    engine.backend.prefill(fresh, live.token_ids)
    assert (fresh.last_logits - live.last_logits).abs().max().item() <= 1e-4


def test_unstable_template_falls_back_to_full_prefill(unstable_engine):
    eng = unstable_engine
    live, _ = eng.feed_messages(eng.new_live(), HISTORY[:2])
    live, fed = eng.feed_messages(live, HISTORY + NEW)
    assert fed.reset and fed.computed_tokens == fed.prompt_tokens
    assert live.token_ids == eng.tokenizer.encode(eng.tokenizer.render(HISTORY + NEW))


def test_max_tokens_stop_leaves_every_generated_token_in_the_state(engine):
    live, fed = engine.feed_messages(engine.new_live(), NEW)
    gen = engine.generate(live, _greedy(max_tokens=4))
    text = "".join(gen)
    engine.settle(live, gen)
    if gen.finish.reason == "length":
        assert len(gen.finish.token_ids) == 4
    assert len(live.token_ids) == fed.prompt_tokens + len(gen.finish.token_ids)
    assert text == gen.finish.text


def test_stop_string_cuts_the_reply(engine):
    live, _ = engine.feed_messages(engine.new_live(), NEW)
    probe = engine.generate(live, _greedy(max_tokens=8))
    full_text = "".join(probe)
    if len(full_text) < 3:
        pytest.skip("the random model stopped before producing text to cut")
    stop = full_text[1:3]
    live2, _ = engine.feed_messages(engine.new_live(), NEW)
    gen = engine.generate(live2, _greedy(max_tokens=8, stop=(stop,)))
    text = "".join(gen)
    assert gen.finish.reason == "stop" and stop not in text and full_text.startswith(text)


def test_cancellation_between_tokens_keeps_the_state_consistent(engine):
    live, fed = engine.feed_messages(engine.new_live(), NEW)
    cancel = threading.Event()
    gen = engine.generate(live, SamplingParams(temperature=1.0, seed=3, max_tokens=50), cancel)
    original_decode = engine.backend.decode
    calls = []

    def decode_then_cancel(lv, tok):
        calls.append(tok)
        if len(calls) == 2:
            cancel.set()
        return original_decode(lv, tok)

    engine.backend.decode = decode_then_cancel
    try:
        list(gen)
    finally:
        engine.backend.decode = original_decode
    engine.settle(live, gen)
    assert gen.finish.reason == "cancelled" and gen.finish.pending is None
    assert len(gen.finish.token_ids) == 2
    assert live.token_ids == live.token_ids[: fed.prompt_tokens] + list(gen.finish.token_ids)
    fresh = engine.new_live()
    engine.backend.prefill(fresh, live.token_ids)
    assert torch.allclose(fresh.last_logits, live.last_logits, atol=1e-4)


def test_seeded_sampling_is_reproducible(engine):
    outs = []
    for _ in range(2):
        live, _ = engine.feed_messages(engine.new_live(), NEW)
        gen = engine.generate(live, SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=8))
        list(gen)
        outs.append(gen.finish.token_ids)
    assert outs[0] == outs[1]
