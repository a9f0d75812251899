"""The SSE events a streamed chat completion is made of (daemon/streaming.py)."""

from __future__ import annotations

import json

import pytest

from engramctl.daemon.logprobs_json import LogprobText
from engramctl.daemon.streaming import Completion, sse
from engramctl.engine.logprobs import TokenLogprob

TEXTS = ["", "Hello", ' "quoted" \\ back', "naïve – 日本語 🙂", "\x00engram-text\x00", "line\nbreak\t\x01", "\ud800"]


class _Bytes:
    """What LogprobText reads of a tokenizer: a token's bytes."""

    def token_bytes(self, token: int) -> bytes:
        return f"<{token}>".encode()


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("kind", ["chat", "text"])
def test_a_text_event_is_the_chunk_it_stands_for(text, kind):
    """Chat completions' chunks, and /v1/completions' text_completion chunks (its Completion subclass)."""
    from engramctl.daemon.routes_completions import TextCompletion

    completion = Completion("m", "0123456789abcdef") if kind == "chat" else TextCompletion("m", "0123", echo="Say")
    for _ in range(2):  # the first call makes the event's frame; the second reuses it
        assert completion.text_sse(text) == sse(completion.chunk({"content": text}))
    event = completion.text_sse(text)
    assert event.startswith("data: ") and event.endswith("\n\n")
    choice = json.loads(event[6:])["choices"][0]
    if kind == "chat":
        assert choice["delta"] == {"content": text}
    else:
        assert choice["text"] == text and choice["finish_reason"] is None


def test_a_text_event_with_logprobs_carries_them():
    completion = Completion("m", "0123456789abcdef", LogprobText(_Bytes()))
    entry = TokenLogprob(token=5, logprob=-0.25, top=())
    event = json.loads(completion.text_sse("Hi", (entry,))[6:])
    assert event == json.loads(sse(completion.chunk({"content": "Hi"}, entries=(entry,)))[6:])
    assert event["choices"][0]["logprobs"] is not None
