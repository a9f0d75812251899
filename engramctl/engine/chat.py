"""Chat turns as token deltas.

A state holds the exact text it consumed. The next turn renders the whole conversation with the chat
template; when that render starts with the consumed text, only the rest is tokenized and fed.
Templates that are not prefix-stable (they drop reasoning, inject dates, render only the last
message) fail the check and the caller re-prefills from scratch: slower, never wrong.
"""

from __future__ import annotations

from engramctl.engine.tokenizer import ChatTokenizer

_PROBE = [
    {"role": "user", "content": "Hello there."},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "Tell me a fact."},
]


def plan_turn(
    tokenizer: ChatTokenizer, consumed_text: str, messages: list[dict], prefix_stable: bool = True
) -> tuple[str, bool]:
    """Returns (text to feed, reset): reset=True means the state must start over with that text."""
    full = tokenizer.render(messages, add_generation_prompt=True)
    if not consumed_text:
        return full, False
    if prefix_stable and full.startswith(consumed_text):  # "" when the state awaits exactly this reply
        return full[len(consumed_text) :], False
    return full, True


def token_delta(tokenizer: ChatTokenizer, history: list[dict], new: list[dict]) -> list[int] | None:
    """tokens(history + new) minus tokens(history), or None when the template is not prefix-stable there."""
    before = tokenizer.render(history, add_generation_prompt=False)
    after = tokenizer.render(history + new, add_generation_prompt=True)
    if not after.startswith(before):
        return None
    ids_before, ids_after = tokenizer.encode(before), tokenizer.encode(after)
    if ids_after[: len(ids_before)] != ids_before:
        return None
    return ids_after[len(ids_before) :]


def is_prefix_stable(tokenizer: ChatTokenizer) -> bool:
    """Probe the template once: does a two-turn render extend the one-turn render?"""
    return token_delta(tokenizer, _PROBE[:2], _PROBE[2:]) is not None


def turn_end_id(tokenizer: ChatTokenizer) -> int | None:
    """The end-of-turn id the template writes after an assistant message (ChatML's <|im_end|>), when it
    is one of the tokenizer's EOS ids; None when the template writes none of them there."""
    before = tokenizer.render(_PROBE[:1], add_generation_prompt=True)
    after = tokenizer.render(_PROBE[:2], add_generation_prompt=False)
    content = _PROBE[1]["content"]
    at = after.find(content, len(before)) if after.startswith(before) else -1
    if at < 0:
        return None
    tail = after[at + len(content) :]
    for eos in sorted(tokenizer.eos_ids):
        text = tokenizer.decode([eos], skip_special=False)
        if text and tail.startswith(text):
            return eos
    return None
