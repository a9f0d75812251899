"""Where a prompt's prefill stops to keep a prefix state: the token counts at which conversations tend to diverge.

    stops = prompt_stops(tokenizer, messages, consumed_text, feed, start)   # absolute token counts, ascending

A recurrent state cannot be cut back to a prefix, so a later prompt can start from a prefix only where a state
was kept. Conversations diverge where a message begins: agents sharing a system prompt part at its end (the
first user message's start), chat UIs and regenerations at a user message's start. The template's own
delimiters mark those places whatever the model: message i begins where the render of messages[:i] ends,
when that render is a prefix of the whole one and tokenizes to a prefix of its ids (else no stop there: a
state at a token count that another prompt's ids never reach would never be reused). A long prompt also
stops every INTERVAL_TOKENS, at absolute multiples, so two prompts sharing a long prefix share a stop near its
end whatever their messages; the caller asks for these only for a prompt that starts a conversation (from an
empty state or a prefix state), not one a conversation continues from its own snapshot, whose turns already
keep a state at each prompt's end (two snapshots a turn) and whose long messages no other conversation sends.

The stops depend only on the prompt's tokens and messages, never on where the state started: a solo run of
the whole prompt and a run restored at any of its stops cut their chunks at the same places after it, which
is what makes a restored run compute bitwise what the solo run computes (engine/turn.py cuts chunks at stops).
"""

from __future__ import annotations

from typing import Sequence

from engramctl.engine.tokenizer import ChatTokenizer

INTERVAL_TOKENS = 2048  # a long prompt keeps a state this often (~23 MB + its KV blocks on a 350M hybrid)
MESSAGE_STOPS_MAX = 8  # the last user messages' starts checked per prompt: each costs a render and a tokenize
MIN_STOP_TOKENS = 16  # a shorter prefix saves less than restoring it costs


def interval_stops(start: int, end: int, interval: int = INTERVAL_TOKENS) -> list[int]:
    """Multiples of `interval` strictly between `start` and `end`."""
    first = (start // interval + 1) * interval
    return list(range(first, end, interval))


def message_stops(
    tokenizer: ChatTokenizer, messages: Sequence[dict], consumed_text: str, feed: Sequence[int], start: int
) -> list[int]:
    """Token counts where the end of the system message(s) and each user message's start fall inside the fed
    part: `feed` (after the `start` tokens the state holds, whose text is `consumed_text`) encodes the render
    of `messages` past `consumed_text`. Only places where the render of the messages before is a prefix of
    the whole render and its tokens are a prefix of the fed ones."""
    stops = []
    for i in _candidates(messages)[-MESSAGE_STOPS_MAX:]:
        before = tokenizer.render(list(messages[:i]), add_generation_prompt=False)
        if len(before) <= len(consumed_text) or not before.startswith(consumed_text):
            continue
        ids = tokenizer.encode(before[len(consumed_text) :])
        if 0 < len(ids) < len(feed) and list(feed[: len(ids)]) == ids:
            stops.append(start + len(ids))
    return stops


def _candidates(messages: Sequence[dict]) -> list[int]:
    """Indexes of the messages whose start is a stop: the first after the system message(s), every user one."""
    out = []
    first_other = next((i for i, m in enumerate(messages) if m.get("role") != "system"), len(messages))
    if 0 < first_other < len(messages):
        out.append(first_other)
    out += [i for i, m in enumerate(messages) if i > 0 and m.get("role") == "user" and i != first_other]
    return sorted(out)


def prompt_stops(
    tokenizer: ChatTokenizer,
    messages: Sequence[dict] | None,
    consumed_text: str,
    feed: Sequence[int],
    start: int,
    interval: int | None = INTERVAL_TOKENS,
) -> list[int]:
    """Every stop of a prompt fed from `start` tokens: its messages' (None: a raw prompt, none) and the
    interval's (None: none), ascending, each at least MIN_STOP_TOKENS and strictly inside the fed part."""
    end = start + len(feed)
    stops = set(interval_stops(start, end, interval)) if interval else set()
    if messages:
        stops.update(message_stops(tokenizer, messages, consumed_text, feed, start))
    return sorted(s for s in stops if start < s < end and s >= MIN_STOP_TOKENS)
