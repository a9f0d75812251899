"""Chat turns (engine/turn.py) as token deltas, on real tiny models with an offline ChatML tokenizer."""

from __future__ import annotations

import threading

import pytest
import torch

from engramctl.engine.chat import is_prefix_stable, token_delta
from engramctl.engine.engine import Engine
from engramctl.engine.generate import Piece
from engramctl.engine.sampling import SamplingParams
from engramctl.engine.turn import Started, Turn
from engramctl.errors import Cancelled, ContextOverflow, EngramError
from engramctl.store import arrays
from tests.backends import both_backends

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


def _turn(engine, live, messages, params=None, pieces: list[str] | None = None):
    """The turn alone; the text pieces it returns go to `pieces`."""
    turn = Turn.for_messages(engine, live, messages, params or _greedy())
    for event in turn.events():
        if pieces is not None and isinstance(event, Piece):
            pieces.append(event)
    return turn.done


def test_second_turn_feeds_only_the_delta_and_matches_a_full_prefill(engine):
    first = _turn(engine, engine.new_live(), HISTORY[:2])
    fed1 = first.prompt
    assert fed1.computed_tokens == fed1.prompt_tokens and not fed1.reset
    live, reply = first.live, first.finish.text
    assert live.token_ids[-len(first.finish.token_ids) :] == list(first.finish.token_ids)  # pending token fed
    messages = HISTORY[:2] + [{"role": "assistant", "content": reply}] + NEW
    before = len(live.token_ids)
    second = _turn(engine, live, messages)
    fed2 = second.prompt
    assert not fed2.reset
    assert fed2.computed_tokens == len(fed2.state.token_ids) - before < fed2.prompt_tokens
    assert fed2.state.text == engine.tokenizer.render(messages, add_generation_prompt=True)
    fresh = engine.new_live()
    engine.prefill(fresh, fed2.state.token_ids)
    assert (fresh.last_logits - fed2.state.last_logits).abs().max().item() <= 1e-4


def test_unstable_template_falls_back_to_full_prefill(unstable_engine):
    eng = unstable_engine
    first = _turn(eng, eng.new_live(), HISTORY[:2])
    turn = Turn.for_messages(eng, first.live, HISTORY + NEW, _greedy())
    assert turn.reset
    fed = turn.run().prompt
    assert fed.reset and fed.computed_tokens == fed.prompt_tokens
    assert list(fed.state.token_ids) == eng.tokenizer.encode(eng.tokenizer.render(HISTORY + NEW))


def test_max_tokens_stop_leaves_every_generated_token_in_the_state(engine):
    pieces: list[str] = []
    done = _turn(engine, engine.new_live(), NEW, _greedy(max_tokens=4), pieces)
    if done.finish.reason == "length":
        assert len(done.finish.token_ids) == 4
    assert len(done.live.token_ids) == done.prompt.prompt_tokens + len(done.finish.token_ids)
    assert "".join(pieces) == done.finish.text
    assert done.reply_state.token_ids == tuple(done.live.token_ids)


def test_stop_string_cuts_the_reply(engine):
    full_text = _turn(engine, engine.new_live(), NEW, _greedy(max_tokens=8)).finish.text
    if len(full_text) < 3:
        pytest.skip("the random model stopped before producing text to cut")
    stop = full_text[1:3]
    pieces: list[str] = []
    done = _turn(engine, engine.new_live(), NEW, _greedy(max_tokens=8, stop=(stop,)), pieces)
    text = "".join(pieces)
    assert done.finish.reason == "stop" and stop not in text and full_text.startswith(text)
    # the state's text is the reply as shown: the next turn's render of the transcript extends it
    assert done.live.text.endswith(text) and stop not in done.live.text[-len(stop) - len(text) :]


def test_cancellation_between_tokens_keeps_the_state_consistent(engine):
    cancel = threading.Event()
    turn = Turn.for_messages(engine, engine.new_live(), NEW, SamplingParams(temperature=1.0, seed=3, max_tokens=50))
    original_decode = engine.backend.decode
    calls = []

    def decode_then_cancel(lv, tok):
        calls.append(tok)
        if len(calls) == 2:
            cancel.set()
        return original_decode(lv, tok)

    engine.backend.decode = decode_then_cancel
    try:
        done = turn.run(cancel)
    finally:
        engine.backend.decode = original_decode
    live = done.live
    assert done.finish.reason == "cancelled" and done.finish.pending is None
    assert len(done.finish.token_ids) == 2
    assert live.token_ids == live.token_ids[: done.prompt.prompt_tokens] + list(done.finish.token_ids)
    fresh = engine.new_live()
    engine.prefill(fresh, live.token_ids)
    assert torch.allclose(fresh.last_logits, live.last_logits, atol=1e-4)


def test_seeded_sampling_is_reproducible(engine):
    outs = []
    for _ in range(2):
        params = SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=8)
        outs.append(_turn(engine, engine.new_live(), NEW, params).finish.token_ids)
    assert outs[0] == outs[1]


def test_a_turn_that_does_not_fit_is_refused_before_touching_the_state(engine):
    live = _turn(engine, engine.new_live(), NEW).live
    before = (list(live.token_ids), live.text, live.last_logits.clone())
    ctx = engine.info.context_length
    with pytest.raises(ContextOverflow, match=r"max_tokens=\d+ would go past the model's context") as e:
        Turn.for_messages(engine, live, NEW + [{"role": "assistant", "content": "x"}] + NEW, _greedy(max_tokens=ctx))
    assert "ask for at most" in e.value.hint
    with pytest.raises(ContextOverflow, match="the conversation needs"):
        Turn.for_messages(engine, live, NEW + [{"role": "user", "content": "word " * ctx}], _greedy())
    assert (list(live.token_ids), live.text) == before[:2] and torch.equal(live.last_logits, before[2])
    # without a requested budget the reply gets what the context has left, at most the default
    turn = Turn.for_messages(
        engine, live, NEW + [{"role": "assistant", "content": "x"}] + NEW, _greedy(None), default_max_tokens=ctx
    )
    assert turn.max_tokens == ctx - turn.prompt_tokens


def test_token_prompt_continues_a_prefix_state_and_feeds_only_the_rest(engine):
    tok = engine.tokenizer
    text = tok.render(HISTORY + NEW, add_generation_prompt=True)
    ids = tok.encode(text)
    prefix = engine.new_live()
    engine.prefill(prefix, ids[:10])
    done = Turn.for_tokens(engine, prefix, ids, text, _greedy(max_tokens=3)).run()
    fed = done.prompt
    assert (fed.prompt_tokens, fed.computed_tokens, fed.cached_tokens) == (len(ids), len(ids) - 10, 10)
    assert list(done.prompt.state.token_ids) == ids and done.prompt.state.text == text
    whole = Turn.for_tokens(engine, engine.new_live(), ids, text, _greedy(max_tokens=3)).run()
    assert whole.finish.token_ids == done.finish.token_ids
    nothing_new = Turn.for_tokens(engine, engine.inject(done.prompt.state), ids, text, _greedy(3))
    assert nothing_new.feed == [] and nothing_new.run().prompt.state is None  # no prompt snapshot for no new tokens
    other = engine.new_live()
    engine.prefill(other, tok.encode("unrelated text"))
    with pytest.raises(EngramError, match="not a prefix"):
        Turn.for_tokens(engine, other, ids, text, _greedy())


def test_a_cancelled_prefill_releases_the_state_and_raises(engine):
    cancel = threading.Event()
    cancel.set()
    live = engine.new_live()
    with pytest.raises(Cancelled):
        Turn.for_messages(engine, live, NEW, _greedy()).run(cancel)
    assert live.cache is None  # released: a llama.cpp backend would have freed its sequence


@both_backends
def test_a_reply_stopped_by_an_eos_the_template_does_not_write_goes_on_without_a_re_prefill(backend, tiny_engine):
    engine = tiny_engine(backend)
    tok = engine.tokenizer
    end = engine.turn_end_id
    assert end is not None and tok.decode([end], skip_special=False) == "<|im_end|>"
    others = sorted(tok.eos_ids - {end})
    if not others:
        pytest.skip("this tokenizer has one EOS id")  # transformers' tiny one; the GGUF adds <|endoftext|>

    def choose_the_other_eos():  # the model's first choice after the prompt: <|endoftext|>, say
        live.last_logits = arrays.copy(live.last_logits)  # a tensor or (llama.cpp) a numpy array
        live.last_logits[:] = -1e9
        live.last_logits[others[0]] = 0.0

    live = engine.new_live()
    turn = Turn.for_messages(engine, live, HISTORY[:2], SamplingParams(temperature=0, max_tokens=4))
    for event in turn.events():
        if isinstance(event, Started):  # the prompt is in; its first token is sampled next
            choose_the_other_eos()
    done = turn.done
    assert (done.finish.reason, done.finish.token_ids) == ("stop", (others[0],))  # the client's view: as sampled
    assert done.live.token_ids[-1] == end and done.live.text.endswith("<|im_end|>")
    conversation = HISTORY[:2] + [{"role": "assistant", "content": done.finish.text}] + NEW
    nxt = Turn.for_messages(engine, done.live, conversation, SamplingParams(temperature=0, max_tokens=2))
    assert not nxt.reset and nxt.feed == tok.encode(tok.render(conversation)[len(done.live.text) :])
