"""The text side of a GGUF model, from the file's own metadata: llama.cpp's tokenizer (vocabulary,
merges, pre-tokenizer, special tokens) and the Jinja chat template in tokenizer.chat_template.

Same interface as engine.tokenizer.ChatTokenizer (eos_ids, has_chat_template, encode, decode, render),
so the Engine, the prefix-stability probe and the daemon use either one unchanged.
"""

from __future__ import annotations

import ctypes
import json
from datetime import datetime
from functools import cached_property, lru_cache

from engramctl.errors import UnsupportedModel


@lru_cache(maxsize=8)
def _compile(template: str):
    """Compiled the way transformers compiles chat templates (sandboxed, trim/lstrip blocks, a tojson
    that does not HTML-escape), so one template renders the same text on both backends."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class GgufTokenizer:
    def __init__(self, lib, model, chat_template: str | None, keepalive: object = None):
        self._lib = lib
        self._keepalive = keepalive  # whatever keeps `model` (and so its vocabulary) from being freed
        self._vocab = lib.llama_model_get_vocab(model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self.chat_template = chat_template or None
        eos = {int(lib.llama_vocab_eos(self._vocab)), int(lib.llama_vocab_eot(self._vocab))}
        # llama.cpp marks every end-of-generation token (<|im_end|>, <|eot_id|>, ...) while loading the vocab
        eos.update(t for t in range(self.n_vocab) if lib.llama_vocab_is_eog(self._vocab, t))
        self.eos_ids: frozenset[int] = frozenset(t for t in eos if t >= 0)
        self.bos_token = self._text(int(lib.llama_vocab_bos(self._vocab)))
        self.eos_token = self._text(int(lib.llama_vocab_eos(self._vocab)))
        self._pieces: dict[int, bytes] = {}  # token -> bytes, filled as tokens are decoded
        self._pieces_special: dict[int, bytes] = {}

    @property
    def llama_vocab(self):
        """llama.cpp's vocabulary handle, for a library that reads it natively (engine/constraint.py)."""
        return self._vocab

    def _text(self, token: int) -> str:
        if token < 0:
            return ""
        raw = self._lib.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", "replace") if raw else ""

    def vocab_text(self, token: int) -> str:
        """The token's string as the vocabulary stores it (a byte-level BPE's "Ġhello"), not decoded."""
        return self._text(token)

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    def encode(self, text: str) -> list[int]:
        # add_special=False: BOS and friends come from the rendered template itself. parse_special=True:
        # "<|im_start|>" in that text is the special token, as a transformers tokenizer reads it.
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        for _ in range(2):
            buf = (self._lib.llama_token * cap)()
            n = self._lib.llama_tokenize(self._vocab, raw, len(raw), buf, cap, False, True)
            if n >= 0:
                return list(buf[:n])
            cap = -n  # too small: llama.cpp returns minus the size it needs
        raise UnsupportedModel(f"llama.cpp could not tokenize a text of {len(raw)} bytes.")

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        # Each token's bytes, concatenated: llama_detokenize would drop the leading space of the first
        # token on SentencePiece vocabularies, so decoding a window of a reply (the streaming decoder
        # does) would lose spaces. A token may end inside a UTF-8 sequence: U+FFFD then tells the
        # streaming decoder to wait for the next one.
        pieces = self._pieces_special if not skip_special else self._pieces
        out = []
        for t in ids:
            piece = pieces.get(t)
            if piece is None:
                piece = pieces[t] = self._piece(int(t), not skip_special)
            out.append(piece)
        return b"".join(out).decode("utf-8", "replace")

    def token_bytes(self, token: int) -> bytes:
        """One token's own bytes (a logprob's `bytes`), special tokens' text included."""
        return self._piece(int(token), True)

    @cached_property
    def max_token_bytes(self) -> int:
        """The longest token's bytes: no text longer than n x this tokenizes to n tokens or fewer."""
        return max(len(self._piece(t, True)) for t in range(self.n_vocab))

    def _piece(self, token: int, special: bool) -> bytes:
        """A token's bytes; control tokens (<|im_end|>) are empty unless `special`."""
        buf = ctypes.create_string_buffer(64)
        n = self._lib.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._lib.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)]

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise UnsupportedModel("this model has no chat template; it cannot hold a chat.")
        return _compile(self.chat_template).render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
