"""Where a prompt stops to keep a prefix state (engine/boundaries.py), on the tiny served model's real chat
template and tokenizer, on both backends (transformers' tokenizer and llama.cpp's own)."""

from __future__ import annotations


from engramctl.engine.boundaries import interval_stops, message_stops, prompt_stops
from tests.backends import both_backends

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 12}
CONVERSATION = [
    SYSTEM,
    {"role": "user", "content": "What is a Mamba layer?"},
    {"role": "assistant", "content": "A selective state-space block."},
    {"role": "user", "content": "And attention?"},
]


def _render_ids(tok, messages, gen=True):
    return tok.encode(tok.render(messages, add_generation_prompt=gen))


@both_backends
def test_stops_fall_where_the_messages_before_end(engine):
    tok = engine.tokenizer
    ids = _render_ids(tok, CONVERSATION)
    stops = message_stops(tok, CONVERSATION, ids)
    expected = [len(_render_ids(tok, CONVERSATION[:i], gen=False)) for i in (1, 3)]
    assert stops == expected
    for i, n in zip((1, 3), stops):  # each stop's ids are exactly those of the messages before it
        assert ids[:n] == _render_ids(tok, CONVERSATION[:i], gen=False)


@both_backends
def test_two_conversations_sharing_a_system_prompt_share_its_stop(engine):
    tok = engine.tokenizer
    a = CONVERSATION[:2]
    b = [SYSTEM, {"role": "user", "content": "Something else entirely, and longer than the first."}]
    ids_a, ids_b = _render_ids(tok, a), _render_ids(tok, b)
    stop_a = prompt_stops(tok, a, ids_a)
    stop_b = prompt_stops(tok, b, ids_b)
    assert stop_a and stop_a[0] == stop_b[0]
    assert ids_a[: stop_a[0]] == ids_b[: stop_b[0]]


@both_backends
def test_a_state_past_a_stop_keeps_only_the_stops_after_it(engine):
    """Fed from a state that already holds the first messages, the stops are the solo run's stops after it,
    whether the state knows its text (a snapshot) or only its ids (a prefix state: held_text "")."""
    tok = engine.tokenizer
    ids = _render_ids(tok, CONVERSATION)
    solo = prompt_stops(tok, CONVERSATION, ids)
    start = solo[0]
    consumed = tok.render(CONVERSATION[:1], add_generation_prompt=False)
    after = [s for s in solo if s > start]
    assert after  # the later user message's start
    assert prompt_stops(tok, CONVERSATION, ids, start, held_text=consumed) == after
    assert prompt_stops(tok, CONVERSATION, ids, start) == after


def test_a_template_that_refuses_a_partial_conversation_gives_no_stop_there():
    """A template may raise on a conversation it does not expect (one ending with its system message, say):
    no stop there, and the prompt's other stops stand."""
    from engramctl.bench.presets import CHATML_TEMPLATE
    from engramctl.engine.tokenizer import ChatTokenizer
    from tests.factory import build_tokenizer

    refuse = "{% if messages[-1]['role'] == 'ROLE' %}{{ raise_exception('no conversation ends so') }}{% endif %}"
    tok = ChatTokenizer(build_tokenizer())
    ids = _render_ids(tok, CONVERSATION)
    solo = prompt_stops(tok, CONVERSATION, ids)
    assert len(solo) == 2
    tok.hf.chat_template = refuse.replace("ROLE", "system") + CHATML_TEMPLATE
    assert _render_ids(tok, CONVERSATION) == ids  # the whole conversation renders as before
    assert prompt_stops(tok, CONVERSATION, ids) == solo[1:]
    tok.hf.chat_template = refuse.replace("ROLE", "assistant") + CHATML_TEMPLATE
    assert prompt_stops(tok, CONVERSATION, ids) == solo[:1]


def test_interval_stops_are_absolute_multiples():
    assert interval_stops(0, 5000, 2048) == [2048, 4096]
    assert interval_stops(2048, 4096, 2048) == []  # the prompt's end is its own snapshot, not a stop
    assert interval_stops(100, 2049, 2048) == [2048]


@both_backends
def test_a_raw_prompt_stops_only_at_intervals(engine):
    ids = list(range(5, 5 + 300))
    assert prompt_stops(engine.tokenizer, None, ids, interval=128) == [128, 256]
    assert prompt_stops(engine.tokenizer, None, ids, 128, interval=128) == [256]
