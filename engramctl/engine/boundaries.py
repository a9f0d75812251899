"""Where a prompt's prefill stops to keep a prefix state: the token counts at which conversations tend to diverge.

    stops = prompt_stops(tokenizer, messages, prompt_ids, after)   # absolute token counts, ascending

A recurrent state cannot be cut back to a prefix, so a later prompt can start from a prefix only where a state
was kept. Conversations diverge where a message begins: agents sharing a system prompt part at its end (the
first user message's start), chat UIs and regenerations at a user message's start. The template's own
delimiters mark those places whatever the model: message i begins where the render of messages[:i] ends,
when that render tokenizes to a prefix of the prompt's ids (else no stop there: a state at ids that another
prompt's tokenization never produces would never be found; a template that refuses to render messages[:i]
gives no stop there either, and the prompt goes on). A long prompt also stops every INTERVAL_TOKENS, at
absolute multiples, so two prompts sharing a long prefix share a stop near its end whatever their messages;
the caller asks for these only for a prompt that starts a conversation (from an empty state or a prefix
state), not one a conversation continues from its own snapshot, whose turns already keep a state at each
prompt's end (two snapshots a turn) and whose long messages no other conversation sends.

The stops are computed from token 0 over the whole prompt, whatever the state the turn starts from holds
(a prefix state holds ids, not text), and only those past it (`after`) are kept: a solo run of the whole
prompt and a run restored at any of its stops cut their chunks at the same places after it, which is what
makes a restored run compute bitwise what the solo run computes (engine/turn.py cuts chunks at stops).
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
    tokenizer: ChatTokenizer, messages: Sequence[dict], ids: Sequence[int], after: int = 0, held_text: str = ""
) -> list[int]:
    """Token counts strictly between `after` and the end of the prompt's `ids` (the whole prompt's, from token 0)
    where the end of the system message(s) or a user message's start falls: where the render of the messages
    before tokenizes to a prefix of `ids`. `held_text`, the text of the state's first `after` tokens when it has
    one, only spares rendering the messages it holds."""
    stops = []
    for i in reversed(_candidates(messages)[-MESSAGE_STOPS_MAX:]):  # latest first: each earlier one is shorter
        before = _render(tokenizer, messages[:i])
        if before is None:
            continue
        if held_text and len(before) <= len(held_text) and held_text.startswith(before):
            break  # the state holds these messages
        before_ids = tokenizer.encode(before)
        n = len(before_ids)
        if n <= after:
            break
        if n < len(ids) and list(ids[:n]) == before_ids:
            stops.append(n)
    return sorted(stops)


def _render(tokenizer: ChatTokenizer, messages: Sequence[dict]) -> str | None:
    """The render of a conversation's first messages, or None when the template refuses it (one that insists on
    ending with a user message, say): no stop there."""
    try:
        return tokenizer.render(list(messages), add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - a template raises what it likes (jinja2's TemplateError, a ValueError, ...)
        return None


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
    ids: Sequence[int],
    after: int = 0,
    interval: int | None = INTERVAL_TOKENS,
    held_text: str = "",
) -> list[int]:
    """Every stop of a prompt (`ids`: all of it, from token 0) past the `after` tokens its state holds: its
    messages' (None: a raw prompt, none) and the interval's (None: none), ascending, each at least
    MIN_STOP_TOKENS and strictly inside the part fed."""
    end = len(ids)
    stops = set(interval_stops(after, end, interval)) if interval else set()
    if messages:
        stops.update(message_stops(tokenizer, messages, ids, after, held_text))
    return sorted(s for s in stops if after < s < end and s >= MIN_STOP_TOKENS)
