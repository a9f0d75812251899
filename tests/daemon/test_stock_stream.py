"""A stock OpenAI client's streaming loop (`chunk.choices[0].delta.content` on every chunk) works: the chunk
without choices that carries the `engram` object (the turn's snapshot id) ends a stream only when the request
names a session or asks for usage (as OpenAI sends one only with include_usage). In-process daemon on the
tiny model, real HTTP, the official openai client."""

from __future__ import annotations

import openai
import pytest

from tests.helpers.inprocess import InProcessDaemon

HELLO = [{"role": "user", "content": "Hello."}]


@pytest.fixture
def oai(tiny_engine, engram_home):
    with InProcessDaemon(tiny_engine("transformers")) as d:
        yield openai.OpenAI(base_url=d.url + "/v1", api_key=d.daemon.token, max_retries=0, timeout=60)


def test_the_common_client_loop_reads_every_chunk_of_an_anonymous_stream(oai):
    chat = oai.chat.completions.create(model="m", messages=HELLO, max_tokens=4, temperature=0, stream=True)
    chunks = list(chat)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)  # IndexError on a chunk without choices
    assert text and chunks[-1].choices[0].finish_reason == "length"
    legacy = list(oai.completions.create(model="m", prompt="Once upon", max_tokens=4, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in legacy) and legacy[-1].choices[0].finish_reason == "length"


def test_a_stream_that_names_a_session_or_asks_for_usage_ends_with_the_engram_chunk(oai):
    named = list(
        oai.chat.completions.create(model="m", messages=HELLO, max_tokens=4, stream=True, extra_body={"session": "s"})
    )
    assert named[-1].choices == [] and len(named[-1].model_extra["engram"]["snapshot_id"]) == 32
    usage = list(
        oai.chat.completions.create(
            model="m", messages=HELLO, max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
    )
    assert usage[-1].choices == [] and usage[-1].usage.completion_tokens == 4
    assert usage[-1].model_extra["engram"]["snapshot_id"]
