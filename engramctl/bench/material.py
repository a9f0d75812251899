"""Deterministic token material: filler text for the context sweep and the fixed user messages of the
multi-turn chat. Seeded, so two runs (and two machines) feed the model exactly the same tokens."""

from __future__ import annotations

import random

from engramctl.bench.presets import CORPUS

USER_MESSAGES = (
    "Hi! Can you help me plan a short trip to the coast this weekend?",
    "I would like to leave on Friday evening. What should I pack?",
    "Good. How long does the drive take if the roads are quiet?",
    "Is it worth stopping at the old harbour on the way?",
    "What could we cook on a small camping stove?",
    "Please list three walks that take less than two hours.",
    "Which of those is best when it is windy?",
    "My friend is bringing a dog. Does that change anything?",
    "Can you suggest a budget for fuel, food and parking?",
    "What if it rains all of Saturday?",
    "Remind me what we decided about the Friday departure.",
    "Write a two-line message inviting one more friend.",
    "How early should we get up to see the sunrise?",
    "Is there anything to do with children nearby?",
    "Summarise the plan so far in five short points.",
    "Which item on the packing list matters most?",
    "Suggest a playlist theme for the drive home.",
    "What should we check before leaving the campsite?",
    "Estimate the total distance we will drive.",
    "Thank you! Give me one last tip for the weekend.",
)


def user_message(turn: int) -> str:
    """The fixed user message of `turn` (0-based); past 20 turns they repeat, numbered."""
    base = USER_MESSAGES[turn % len(USER_MESSAGES)]
    return base if turn < len(USER_MESSAGES) else f"{base} ({turn + 1})"


FILLER_CHARS_PER_TOKEN = 2.7  # filler_text on SmolLM2's and Granite's tokenizers, measured


def filler_words(seed: int, chars: int) -> str:
    """filler_text cut to at most `chars` characters, at the end of a word."""
    return filler_text(seed, chars)[:chars].rsplit(" ", 1)[0]


def filler_text(seed: int, min_chars: int) -> str:
    lines = [ln for ln in CORPUS.splitlines() if ln.strip()]
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < min_chars:
        rng.shuffle(lines)
        for ln in lines:
            out.append(ln)
            size += len(ln) + 1
    return "\n".join(out)


def filler_ids(tokenizer, n: int, seed: int) -> list[int]:
    """Exactly `n` token ids of seeded filler text (no special tokens)."""
    chars = max(64, 4 * n)
    while True:
        ids = tokenizer.encode(filler_text(seed, chars))
        if len(ids) >= n:
            return ids[:n]
        chars *= 2
