"""A turn's prefill stops (engine/turn.py `Turn(stops=...)`): a prompt chunk ends at each stop and the turn
returns the state there (a PrefixState event); a stop only cuts chunks, so the turn computes bitwise what a turn
whose prompt is fed in chunks cut at the same places computes. On the tiny hybrid model (attention and Mamba2
layers), on llama.cpp and on transformers, which both cut a prompt into chunks of `chunk_tokens`."""

from __future__ import annotations

import random

import pytest

from engramctl.engine.engine import Engine
from engramctl.engine.sampling_params import SamplingParams
from engramctl.engine.turn import PrefixState, PromptState, Started, Turn, TurnDone
from engramctl.state import SessionState
from engramctl.store import arrays
from tests.backends import BACKENDS, SERVED_FAMILY

CHUNK = 16
IDS = random.Random(11).choices(range(3, 200), k=60)
GREEDY = SamplingParams(temperature=0.0, max_tokens=5)


@pytest.fixture(scope="module", params=BACKENDS)
def chunked(request, served_model, load_llama, load_backend, zoo) -> Engine:
    """The tiny hybrid model with CHUNK-token prefill chunks, on each backend."""
    if request.param == "llama.cpp":
        backend = load_llama(served_model("llama.cpp"), chunk_tokens=CHUNK)
    else:
        backend = load_backend(zoo.path(SERVED_FAMILY), chunk_tokens=CHUNK)
    return Engine(backend, backend.tokenizer)


def _same(a: SessionState, b: SessionState) -> bool:
    """The same state, bitwise: tokens, logits and every tensor of every layer."""
    if a.token_ids != b.token_ids or not arrays.equal(a.last_logits, b.last_logits) or len(a.layers) != len(b.layers):
        return False
    for x, y in zip(a.layers, b.layers):
        tx, ty = x.tensors(), y.tensors()
        if tx.keys() != ty.keys() or not all(arrays.equal(tx[k], ty[k]) for k in tx):
            return False
    return True


def _fed_in_chunks(engine: Engine, cuts: list[int]):
    """A Live fed IDS in chunks ending at `cuts` (one step each, as a turn feeds them); its state at each cut."""
    live, start, states = engine.new_live(), 0, {}
    for end in cuts:
        engine.step([(live, IDS[start:end])])
        states[end], start = engine.capture(live), end
    return live, states


def test_a_stop_ends_a_chunk_and_the_turn_returns_the_state_there(chunked):
    engine = chunked
    stops = [0, 10, 37, 60, 99]  # 0 and the prompt's end (60) and past it are ignored
    turn = Turn.for_tokens(engine, engine.new_live(), IDS, "", GREEDY, stops=stops)
    fed: list[int] = []
    real_step = engine.step

    def recording(work):
        fed.extend(len(tokens) for _, tokens in work)
        return real_step(work)

    engine.step = recording
    try:
        events = list(turn.events())
    finally:
        del engine.step
    prefixes = [e for e in events if isinstance(e, PrefixState)]
    assert [p.n_tokens for p in prefixes] == [10, 37]
    assert [p.token_ids for p in prefixes] == [tuple(IDS[:10]), tuple(IDS[:37])]
    assert events.index(prefixes[-1]) < next(i for i, e in enumerate(events) if isinstance(e, Started))
    cuts = [10, 26, 37, 53, 60]  # the chunks end at the stops, and are otherwise CHUNK tokens long
    assert fed[: len(cuts)] == [b - a for a, b in zip([0] + cuts, cuts)]

    # a stop only cuts chunks: the same states and reply as a prompt fed in chunks cut at the same places
    live, states = _fed_in_chunks(engine, cuts)
    for p in prefixes:
        assert _same(p.state, states[p.n_tokens])
    prompt = next(e for e in events if isinstance(e, PromptState)).prompt
    assert _same(prompt.state, states[60])
    done: TurnDone = events[-1]
    alone = Turn.for_tokens(engine, live, IDS, "", GREEDY).run()  # nothing left to feed: it samples at once
    assert done.finish.token_ids == alone.finish.token_ids
    assert _same(done.reply_state, alone.reply_state)


def test_stops_at_or_below_what_the_state_holds_are_ignored(chunked):
    engine = chunked
    live = engine.new_live()
    engine.step([(live, IDS[:20])])
    turn = Turn.for_tokens(engine, live, IDS, "", GREEDY, stops=[5, 20, 30])
    assert turn.stops == [30]
    prefixes = [e for e in turn.events() if isinstance(e, PrefixState)]
    assert [(p.n_tokens, p.token_ids) for p in prefixes] == [(30, tuple(IDS[:30]))]
    assert len(turn.done.live.token_ids) == 60 + len(turn.done.finish.token_ids)
