"""Token logprobs (engine/logprobs.py's TokenLogprob entries) in OpenAI's two shapes.

Chat completions: `choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob,
bytes}]}], "refusal": null}`. The legacy completions: `choices[].logprobs = {tokens, token_logprobs,
top_logprobs: [{token: logprob}], text_offset}`, text_offset counting characters of the answer's text.
A token's text is its own bytes decoded (a token holding part of a character shows U+FFFD there; `bytes`
has the exact bytes). A streamed answer's chunks carry the entries of the tokens their text covers, so their
lists concatenated are the non-streamed answer's.
"""

from __future__ import annotations

import codecs
from typing import Any, Protocol, Sequence

from engramctl.engine.logprobs import TokenLogprob


class _Vocabulary(Protocol):
    def token_bytes(self, token: int) -> bytes: ...


class LogprobText:
    """Renders entries with one tokenizer's token texts (each token's bytes looked up once)."""

    def __init__(self, tokenizer: _Vocabulary):
        self._tok = tokenizer
        self._bytes: dict[int, bytes] = {}

    def token(self, token: int) -> tuple[str, bytes]:
        raw = self._bytes.get(token)
        if raw is None:
            raw = self._bytes[token] = self._tok.token_bytes(token)
        return raw.decode("utf-8", "replace"), raw

    def _one(self, token: int, logprob: float) -> dict[str, Any]:
        text, raw = self.token(token)
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    def chat(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        """A chat choice's (or chunk's) `logprobs` object."""
        content = [
            {**self._one(e.token, e.logprob), "top_logprobs": [self._one(t, lp) for t, lp in e.top]} for e in entries
        ]
        return {"content": content, "refusal": None}

    def completion(self, entries: Sequence[TokenLogprob], offsets: "TextOffsets") -> dict[str, Any]:
        """A text completion choice's (or chunk's) `logprobs` object; `offsets` runs on across chunks."""
        tokens, token_logprobs, top, text_offset = [], [], [], []
        for e in entries:
            text, raw = self.token(e.token)
            tokens.append(text)
            token_logprobs.append(e.logprob)
            alternatives: dict[str, float] = {}
            for t, lp in e.top:
                alternatives.setdefault(self.token(t)[0], lp)  # tokens of one text: the likelier one's
            top.append(alternatives)
            text_offset.append(offsets.advance(raw))
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": text_offset}


class TextOffsets:
    """Where each token starts in the answer's text, in characters: the text before the reply (an echoed
    prompt), then each token's bytes as decoded so far (a character split across tokens counts once whole)."""

    def __init__(self, start: int = 0):
        self._at = start
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def advance(self, raw: bytes) -> int:
        at = self._at
        self._at += len(self._decoder.decode(raw))
        return at
