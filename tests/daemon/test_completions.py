"""POST /v1/completions against a real daemon with the official openai client, on both backends: a prompt as
text, as token ids, or a list of one; streaming; echo, stop, max_tokens; a prompt that extends an earlier
prompt and its completion reuses that state (cached_tokens); what cannot be honoured is a 400 naming the field.
The fill-in-the-middle prompt itself is tested in tests/engine/test_fim.py (no served test model has FIM
tokens: the tiny one's vocabulary is full, SmolLM2's has none)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.backends import both_backends
from tests.helpers import module_daemon

pytestmark = both_backends

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"


daemon = module_daemon("completions-home", backend_flag=True)


@pytest.fixture
def oai(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key=daemon.token, max_retries=0, timeout=60)


def greedy_completion(backend, ids: list[int], max_tokens: int) -> str:
    """What a stateless server answers: a full prefill of the prompt's ids, then greedy decoding."""
    from engramctl.engine.engine import Engine
    from engramctl.engine.sampling import SamplingParams

    engine = Engine(backend, backend.tokenizer)
    live = backend.new_live()
    backend.prefill(live, ids)
    return "".join(engine.generate(live, SamplingParams(temperature=0.0, max_tokens=max_tokens)))


def test_a_text_prompt_completes_as_a_full_prefill_does(oai, reference_backend):
    r = oai.completions.create(model="default", prompt=PROMPT, max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    choice = r.choices[0]
    ids = reference_backend.tokenizer.encode(PROMPT)
    assert choice.text == greedy_completion(reference_backend, ids, 6)
    assert choice.finish_reason in ("stop", "length") and choice.index == 0 and choice.logprobs is None
    assert r.usage.prompt_tokens == len(ids) and 0 < r.usage.completion_tokens <= 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.model_extra["engram"]["session"].startswith("auto-")

    # the same prompt as token ids, and each in a list of one: the same completion
    for prompt in (ids, [PROMPT], [ids]):
        again = oai.completions.create(model="default", prompt=prompt, max_tokens=6, temperature=0)
        assert again.choices[0].text == choice.text


def test_streaming_sends_the_same_text_in_pieces_with_usage(oai):
    prompt = "Streams of text arrive piece by piece, and"
    whole = oai.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=0)
    chunks = list(
        oai.completions.create(
            model="default",
            prompt=prompt,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == whole.choices[0].text and len([t for t in texts if t]) >= 2
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert all(c.object == "text_completion" for c in chunks)
    usage = chunks[-1].usage
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens  # the same prompt: all of it stored


def test_echo_stop_and_max_tokens(oai):
    prompt = "Counting: one, two, three,"
    plain = oai.completions.create(model="default", prompt=prompt, max_tokens=5, temperature=0).choices[0].text
    echoed = oai.completions.create(model="default", prompt=prompt, max_tokens=5, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + plain
    streamed = oai.completions.create(
        model="default", prompt=prompt, max_tokens=5, temperature=0, echo=True, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == prompt + plain
    one = oai.completions.create(model="default", prompt=prompt, max_tokens=1, temperature=0)
    assert one.usage.completion_tokens == 1 and one.choices[0].finish_reason == "length"
    longer = oai.completions.create(model="default", prompt=prompt, max_tokens=12, temperature=0).choices[0].text
    cut = next((longer[:i] for i in range(2, len(longer)) if longer[i - 1 : i + 1].strip()), None)
    if cut:  # stop on a piece of the greedy text: the answer is what came before it
        stop = longer[len(cut) - 1 : len(cut) + 1]
        r = oai.completions.create(model="default", prompt=prompt, max_tokens=12, temperature=0, stop=[stop])
        assert r.choices[0].finish_reason == "stop" and stop not in r.choices[0].text
        assert longer.startswith(r.choices[0].text)


def test_a_prompt_that_extends_an_earlier_one_reuses_its_state(oai, reference_backend):
    tok = reference_backend.tokenizer
    first = "A conversation with a language model begins with a prompt like this one"
    r1 = oai.completions.create(model="default", prompt=first, max_tokens=5, temperature=0)
    # the prompt extended (at a word boundary, so its tokens start with the first prompt's): that state is reused
    follow = first + " and goes on"
    r2 = oai.completions.create(model="default", prompt=follow, max_tokens=5, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens == r1.usage.prompt_tokens
    assert r2.choices[0].text == greedy_completion(reference_backend, tok.encode(follow), 5)  # as a full prefill
    # the prompt, its completion's own tokens, then more (a client that keeps token ids): the reply state is reused
    ids = tok.encode(first)
    reply = _greedy_ids(reference_backend, ids, 5)
    more = ids + reply + tok.encode(" and more")
    r3 = oai.completions.create(model="default", prompt=more, max_tokens=5, temperature=0)
    assert r3.usage.prompt_tokens_details.cached_tokens == len(ids) + len(reply)
    assert r3.choices[0].text == greedy_completion(reference_backend, more, 5)


def _greedy_ids(backend, ids: list[int], max_tokens: int) -> list[int]:
    from engramctl.engine.engine import Engine
    from engramctl.engine.sampling import SamplingParams

    live = backend.new_live()
    backend.prefill(live, ids)
    gen = Engine(backend, backend.tokenizer).generate(live, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    list(gen)
    return list(gen.finish.token_ids)


def test_what_cannot_be_honoured_is_a_400_naming_the_field(daemon, backend):
    with httpx.Client(base_url=daemon.url, headers=daemon.headers, timeout=60) as c:
        for body, field in (
            ({"prompt": ["one", "two"]}, "prompt"),
            ({"prompt": ""}, "prompt"),
            ({"prompt": [10**9]}, "prompt"),
            ({"prompt": [2**70], "echo": True}, "prompt"),  # regression (schema fuzz): decoded for echo unchecked
            ({"prompt": "\udfff"}, "prompt"),  # half a UTF-16 pair, as JSON may escape it: no tokenizer takes it
            ({"prompt": "x", "logprobs": 6}, "logprobs"),  # OpenAI's legacy bound: 0 to 5
            ({"prompt": "x", "n": 2}, "n"),
            ({"prompt": "x", "best_of": 3}, "best_of"),
            ({"prompt": "x", "suffix": "y"}, "suffix"),  # the tiny model has no fill-in-the-middle tokens
            ({"prompt": "x", "suffix": "y", "echo": True}, "suffix"),
            ({"prompt": "x", "logit_bias": {"999999": 1}}, "logit_bias"),
            ({"prompt": "x", "max_tokens": 10**9}, "max_tokens"),
        ):
            # json.dumps escapes a lone surrogate as "\udfff" (httpx's json= would fail to encode it)
            payload = json.dumps({"model": "default", "max_tokens": 2, **body})
            r = c.post("/v1/completions", content=payload, headers={"Content-Type": "application/json"})
            assert r.status_code == 400, (body, r.text)
            assert field in r.json()["error"]["message"], (body, r.text)
