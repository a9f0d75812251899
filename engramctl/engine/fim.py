"""Fill-in-the-middle: the prompt a model trained for it completes between a prefix and a suffix.

A vocabulary has FIM tokens when it has one of the known spellings of the three as special tokens
(llama.cpp finds a GGUF's the same way, by their text, when its metadata does not name them). The
prompt is prefix-suffix-middle order (PSM), as llama-server's /infill and StarCoder-style models use it.
"""

from __future__ import annotations

from typing import Any

from engramctl.errors import UsageError

# (prefix, suffix, middle) as the model families spell them
SPELLINGS = (
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SmolLM2
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
    ("<|fim▁begin|>", "<|fim▁hole|>", "<|fim▁end|>"),  # DeepSeek-Coder
    ("<PRE>", "<SUF>", "<MID>"),  # CodeLlama
    ("<|fim_begin|>", "<|fim_hole|>", "<|fim_end|>"),
)


def _special_id(tok: Any, text: str) -> int | None:
    """The id of `text` when it is one special token of the vocabulary (it decodes to nothing as text)."""
    ids = tok.encode(text)
    if len(ids) == 1 and tok.decode(ids, skip_special=True) == "" and tok.decode(ids, skip_special=False) == text:
        return ids[0]
    return None


def fim_ids(tok: Any) -> tuple[int, int, int] | None:
    """(prefix, suffix, middle) token ids, or None when the vocabulary has no FIM tokens."""
    for spelling in SPELLINGS:
        ids = tuple(_special_id(tok, t) for t in spelling)
        if None not in ids:
            return ids  # type: ignore[return-value]
    return None


def infill_ids(tok: Any, prefix: list[int], suffix: str) -> list[int]:
    """The token ids of a FIM prompt: <prefix> prefix <suffix> suffix <middle>."""
    ids = fim_ids(tok)
    if ids is None:
        raise UsageError(
            "suffix: this model has no fill-in-the-middle tokens, so it cannot complete between a prompt and a suffix."
        )
    pre, suf, mid = ids
    return [pre, *prefix, suf, *tok.encode(suffix), mid]
