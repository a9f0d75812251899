"""The JSON text of an object a stream sends once a token, of which only a few strings change.

A streamed reply is one event a token (an OpenAI SSE chunk, an Ollama NDJSON line); building its dict and
encoding it whole each time cost the event loop ~30-45 us of CPU a token (issue 18: with the caches a decode
leaves cold, every Python operation counts). A Frame encodes the object once with placeholders where the
changing strings go, and then encodes only those:

    frame = Frame({"model": "m", "created_at": slot(0), "response": slot(1)})
    frame.fill(now, text) == encode({"model": "m", "created_at": now, "response": text})
"""

from __future__ import annotations

import json
import re
from typing import Any

_ENCODER = json.JSONEncoder(ensure_ascii=False)  # made once: json.dumps(..., ensure_ascii=False) makes one a call
_SLOTS = 4


def encode(obj: Any) -> str:
    """The JSON text the daemon's streams send (UTF-8 as is, no ASCII escapes)."""
    return _ENCODER.encode(obj)


def slot(i: int) -> str:
    """The placeholder of the i-th changing string: control bytes, which JSON writes as \\u0000, so no text a
    caller fills in can be mistaken for one."""
    return f"\x00engram-slot-{i}\x00"


_MARKERS = {encode(slot(i)): i for i in range(_SLOTS)}
_CUT = re.compile("(" + "|".join(re.escape(m) for m in _MARKERS) + ")")


class Frame:
    def __init__(self, obj: Any):
        pieces = _CUT.split(encode(obj))  # text, marker, text, marker, ..., text
        self._texts = pieces[0::2]
        self._slots = [_MARKERS[m] for m in pieces[1::2]]

    def fill(self, *values: str) -> str:
        out = [self._texts[0]]
        for i, text in zip(self._slots, self._texts[1:]):
            out += (_ENCODER.encode(values[i]), text)
        return "".join(out)
