"""The text side of a model: encode/decode, the chat template, end-of-turn tokens."""

from __future__ import annotations

from functools import cache, cached_property
from typing import Any

from engramctl.errors import UnsupportedModel


class ChatTokenizer:
    """Wraps a transformers tokenizer; a second backend supplies its own object with these methods."""

    def __init__(self, hf_tokenizer: Any, generation_eos: int | list[int] | None = None):
        self.hf = hf_tokenizer
        eos = set()
        for e in (generation_eos, hf_tokenizer.eos_token_id):
            if isinstance(e, int):
                eos.add(e)
            elif e:
                eos.update(int(x) for x in e)
        self.eos_ids: frozenset[int] = frozenset(eos)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    @cached_property
    def max_token_bytes(self) -> int:
        """The longest token's text in UTF-8 bytes (at least its bytes: a byte-level or SentencePiece vocabulary
        writes a byte as one character of one to three bytes)."""
        return max(len(str(t).encode()) for t in self.hf.get_vocab())

    def encode(self, text: str) -> list[int]:
        # Special tokens come from the rendered template itself; adding BOS again would shift the state.
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special, clean_up_tokenization_spaces=False)

    def token_bytes(self, token: int) -> bytes:
        """One token's own bytes (a logprob's `bytes`), special tokens' text included. A byte-level BPE token
        may hold part of a character, which decoding it alone would turn into U+FFFD: its vocabulary string
        is mapped back to bytes instead."""
        piece = self.hf.convert_ids_to_tokens(int(token))
        decoder = getattr(getattr(self.hf, "backend_tokenizer", None), "decoder", None)
        if piece is not None and type(decoder).__name__ == "ByteLevel":
            table = _byte_decoder()
            if all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
        return self.decode([int(token)], skip_special=False).encode("utf-8")

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.has_chat_template:
            raise UnsupportedModel("this model has no chat template; it cannot hold a chat.")
        return self.hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)


@cache
def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's printable stand-in character -> the byte it stands for (GPT-2's table)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {ch: b for b, ch in bytes_to_unicode().items()}
