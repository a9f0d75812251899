"""A request no tokenization could fit in the context is refused from its length alone, before the worker
tokenizes it (llama.cpp's tokenizer took 37 s on 32,000 one-word messages, 13+ minutes on 200,000, while every
other request waited). In-process daemon on the tiny model (both backends' tokenizers), real HTTP, the official
openai client."""

from __future__ import annotations

import time

import pytest

from tests.helpers.inprocess import InProcessDaemon

HELLO = [{"role": "user", "content": "Hello."}]


@pytest.mark.parametrize("backend", ["transformers", "llama.cpp"])
def test_a_request_too_long_for_any_tokenization_is_refused_before_tokenizing(tiny_engine, engram_home, backend):
    """Thousands of messages: llama.cpp's tokenizer takes seconds to minutes on a text dense with special
    tokens, on the worker every request waits for; a text longer than context x the longest token is refused
    from its length alone."""
    engine = tiny_engine(backend)
    n_bytes = engine.info.context_length * engine.tokenizer.max_token_bytes
    messages = [{"role": "user", "content": "x" * 100}] * (n_bytes // 100 + 10)
    with InProcessDaemon(engine) as d:
        oai, h = d.clients()
        with h:
            t0 = time.monotonic()
            r = h.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
            assert "bytes of text" in r.json()["error"]["message"] and time.monotonic() - t0 < 30
            text = "x" * (n_bytes + 10)
            r = h.post("/v1/completions", json={"prompt": text, "max_tokens": 2})
            assert r.status_code == 400 and "bytes of text" in r.json()["error"]["message"], r.text
            assert oai.chat.completions.create(model="m", messages=HELLO, max_tokens=2).choices  # still serving
