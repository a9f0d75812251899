"""Every 400 names the field to blame in `param`, with one `code` spelling for a malformed request
(invalid_request_error, UsageError's kind, whether pydantic or a route refused it); /v1/completions without
max_tokens stops at OpenAI's 16 tokens. In-process daemon on the tiny model, the official openai client."""

from __future__ import annotations

import openai
import pytest

from engramctl.daemon.errors import field_named, validation_problem
from tests.helpers.inprocess import InProcessDaemon

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture
def daemon(tiny_engine, engram_home):
    with InProcessDaemon(tiny_engine("transformers")) as d:
        yield d


@pytest.mark.parametrize(
    "path, body, param, code",
    [
        ("/v1/chat/completions", {**CHAT, "n": 2}, "n", "invalid_request_error"),
        ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs", "invalid_request_error"),
        ("/v1/chat/completions", {**CHAT, "logit_bias": {"99999999": 1}}, "logit_bias", "invalid_request_error"),
        ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 10_000_000}, "max_completion_tokens", None),
        ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, "tool_choice", "invalid_request_error"),
        ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, "temperature", "invalid_request_error"),
        ("/v1/completions", {"model": "m", "prompt": ""}, "prompt", "invalid_request_error"),
        ("/v1/completions", {"model": "m", "prompt": [-1]}, "prompt", "invalid_request_error"),
        ("/v1/completions", {"model": "m", "prompt": "x", "n": 3}, "n", "invalid_request_error"),
        ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "x", "images": ["a"]}]}, None, None),
    ],
)
def test_a_400_names_its_field(daemon, path, body, param, code):
    _, h = daemon.clients()
    with h:
        r = h.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    if path == "/api/chat":
        assert err["param"] == "messages[0].images", err
        return
    assert err["param"] == param, err
    assert err["message"].startswith(param) and "(and " not in err["message"], err
    if code:
        assert err["code"] == code, err
    if body.get("prompt") == [-1]:
        assert "-1" in err["message"] and "prompt.str" not in err["message"]
    if param == "max_completion_tokens":
        assert err["code"] == "context_length_exceeded" and "max_tokens" not in err["message"]


def test_completions_default_to_openai_s_16_tokens(daemon):
    oai, h = daemon.clients()
    h.close()
    r = oai.completions.create(model="m", prompt="Once upon a time", temperature=0, logit_bias={})
    assert r.usage.completion_tokens <= 16
    if r.choices[0].finish_reason == "length":
        assert r.usage.completion_tokens == 16
    longer = oai.completions.create(model="m", prompt="Once upon a time", temperature=0, max_tokens=20)
    assert longer.usage.completion_tokens > 16 or longer.choices[0].finish_reason == "stop"


def test_the_field_is_read_from_the_sentence():
    assert field_named("top_logprobs: needs logprobs: true") == "top_logprobs"
    assert (
        field_named("tools[1].function.parameters: the JSON Schema uses uniqueItems") == "tools[1].function.parameters"
    )
    assert field_named("the request body is not valid JSON: x") is None
    assert field_named("every message in the request is already in session 'a''s transcript") is None
    message, param = validation_problem([{"loc": ("body",), "msg": "Value error, n: only 1 is supported"}])
    assert (message, param) == ("n: only 1 is supported", "n")
