"""Streaming text out of token ids: never emit half a multi-byte character, hold back a possible stop string."""

from __future__ import annotations

from typing import Callable

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Decodes a growing id list and returns only new, complete text. A byte-level BPE token can end
    inside a UTF-8 sequence; its decode then ends in U+FFFD, so we wait for the next token."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self.ids: list[int] = []
        self._prefix_offset = 0  # ids before this were emitted and are only context
        self._read_offset = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        full = self._decode(self.ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.ids)
            return full[len(prefix) :]
        return ""


class StopMatcher:
    """Emits text up to a stop string; holds back a tail that could still become one."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self._buf = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, stop string found)."""
        self._buf += text
        hits = [i for i in (self._buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self._buf = self._buf[: min(hits)], ""
            return out, True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self._buf)), 0, -1):
                if self._buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        out = self._buf[: len(self._buf) - hold]
        self._buf = self._buf[len(self._buf) - hold :]
        return out, False

    def flush(self) -> str:
        out, self._buf = self._buf, ""
        return out
