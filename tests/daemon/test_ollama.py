"""Ollama's API against a real daemon with the official `ollama` Python client (the bearer token through its
`headers=`), on both backends: chat and generate, streamed and not, with Ollama's options and timing fields;
list, show, ps, version; a resent conversation (chat) or a returned `context` (generate) continues from its
snapshot (prompt_eval_count counts only the new tokens); a `format` the grammar cannot enforce is refused, naming it."""

from __future__ import annotations

import httpx
import ollama
import pytest

from tests.backends import both_backends, served_id
from tests.daemon.conftest import greedy_reference
from tests.helpers import module_daemon

pytestmark = both_backends

GREEDY = {"temperature": 0, "num_predict": 6, "repeat_penalty": 1.0}  # Ollama's default is 1.1
TIMINGS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


daemon = module_daemon("ollama-home", backend_flag=True)


@pytest.fixture
def client(daemon) -> ollama.Client:
    return ollama.Client(host=daemon.url, headers=daemon.headers, timeout=60)


def test_list_show_ps_version(client, daemon, backend, served):
    name = served_id(backend, served)
    with httpx.Client(base_url=daemon.url, headers=daemon.headers) as c:
        family = c.get("/v1/models").json()["data"][0]["engram"]["family"]
        assert c.get("/api/version").json()["version"]
    models = client.list().models
    assert [m.model for m in models] == [name]
    m = models[0]
    assert m.size > 0 and m.digest and m.modified_at is not None
    assert m.details.family == family and m.details.format == ("gguf" if backend == "llama.cpp" else "safetensors")
    shown = client.show(name)
    assert shown.details.family == family and "completion" in shown.capabilities
    assert shown.modelinfo["general.architecture"] == family and "im_start" in shown.template
    assert client.show("default").details == shown.details
    with pytest.raises(ollama.ResponseError) as e:
        client.show("no-such-model")
    assert e.value.status_code == 404
    running = client.ps().models
    assert [r.model for r in running] == [name] and running[0].context_length > 0 and running[0].expires_at


def test_chat_answers_as_the_openai_route_and_streams_the_same(client, reference_backend):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a state space model?"}]
    r = client.chat(model="default", messages=messages, stream=False, options=GREEDY)
    assert r.message.role == "assistant" and r.message.content == greedy_reference(reference_backend, messages, 6)
    assert r.done and r.done_reason in ("stop", "length") and 0 < r.eval_count <= 6
    assert r.prompt_eval_count > 0 and all(getattr(r, k) >= 0 for k in TIMINGS) and r.created_at
    assert r.total_duration >= r.eval_duration
    parts = list(client.chat(model="default", messages=messages, stream=True, options=GREEDY))
    assert "".join(p.message.content for p in parts) == r.message.content
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done and parts[-1].eval_count == r.eval_count
    # the same conversation again: its prompt snapshot covers all of it, nothing is prefilled
    assert parts[-1].prompt_eval_count == 0


def test_a_resent_conversation_reuses_its_snapshot(client, reference_backend):
    first = [{"role": "user", "content": "Tell me about hybrid models."}]
    r1 = client.chat(model="default", messages=first, options=GREEDY, stream=False)
    second = first + [
        {"role": "assistant", "content": r1.message.content},
        {"role": "user", "content": "And their state?"},
    ]
    r2 = client.chat(model="default", messages=second, options=GREEDY, stream=False)
    tok = reference_backend.tokenizer
    whole = len(tok.encode(tok.render(second, add_generation_prompt=True)))
    first_prompt = len(tok.encode(tok.render(first, add_generation_prompt=True)))
    # at least the first turn's prompt state is restored (its reply state too, unless the reply's text does not
    # re-tokenize to its own tokens: the random tiny model writes broken UTF-8): only the rest is prefilled
    assert 0 < r2.prompt_eval_count <= whole - first_prompt, (r2.prompt_eval_count, whole, first_prompt)
    assert r2.message.content == greedy_reference(reference_backend, second, 6)


def test_generate_with_context_continues_from_the_state(client, reference_backend):
    r1 = client.generate(model="default", prompt="Why is the sky blue?", options=GREEDY, stream=False)
    assert r1.done and r1.response and r1.context and r1.eval_count > 0
    tok = reference_backend.tokenizer
    prompt_ids = tok.encode(
        tok.render([{"role": "user", "content": "Why is the sky blue?"}], add_generation_prompt=True)
    )
    assert r1.context[: len(prompt_ids)] == prompt_ids and len(r1.context) == len(prompt_ids) + r1.eval_count
    assert r1.prompt_eval_count == len(prompt_ids)
    parts = list(
        client.generate(model="default", prompt="And at night?", context=r1.context, options=GREEDY, stream=True)
    )
    last = parts[-1]
    assert last.done and last.context[: len(r1.context)] == r1.context
    new = len(tok.encode(tok.render([{"role": "user", "content": "And at night?"}], add_generation_prompt=True)))
    assert last.prompt_eval_count == new  # the context's tokens came from the snapshot
    assert "".join(p.response for p in parts) != "" or last.eval_count > 0
    raw = client.generate(model="default", prompt="Once upon a time", raw=True, options=GREEDY, stream=False)
    assert raw.prompt_eval_count == len(tok.encode("Once upon a time"))


def test_options_are_honoured(client):
    long = client.generate(
        model="default", prompt="Count with me", options={"temperature": 0, "num_predict": 12}, stream=False
    )
    assert long.eval_count == 12 and long.done_reason == "length"
    one = client.generate(
        model="default", prompt="Count with me", options={"temperature": 0, "num_predict": 1}, stream=False
    )
    assert one.eval_count == 1 and long.response.startswith(one.response)
    seeded = {"temperature": 1.5, "top_k": 50, "top_p": 0.95, "min_p": 0.01, "seed": 42, "num_predict": 8}
    a = client.generate(model="default", prompt="Surprise me", options=seeded, stream=False).response
    b = client.generate(model="default", prompt="Surprise me", options=seeded, stream=False).response
    assert a == b
    cut = long.response[2:4]
    if cut.strip():
        stopped = client.generate(
            model="default",
            prompt="Count with me",
            options={"temperature": 0, "num_predict": 12, "stop": [cut]},
            stream=False,
        )
        assert stopped.done_reason == "stop" and cut not in stopped.response
    # past the context: Ollama stops where the context ends, it is no error
    # a num_predict past the context is no error (Ollama stops where the context ends); a stop string ends it here
    stop = next(c for c in long.response if c.strip())
    huge = client.generate(
        model="default",
        prompt="Count with me",
        options={"temperature": 0, "num_predict": 10**9, "num_ctx": 8, "stop": [stop]},
        stream=False,
        keep_alive="5m",
    )
    assert huge.done and huge.done_reason == "stop" and long.response.startswith(huge.response)


def test_refusals_name_the_field(client):
    for call, field in (
        (
            lambda: client.chat(model="default", messages=[{"role": "user", "content": "x"}], format={"not": {}}),
            "format: the JSON Schema uses not",
        ),
        (
            lambda: client.generate(model="default", prompt="x", format={"type": "array", "uniqueItems": True}),
            "format: the JSON Schema uses uniqueItems",
        ),
        (
            lambda: client.chat(
                model="default", messages=[{"role": "user", "content": "x"}], options={"temperature": -1}
            ),
            "temperature",
        ),
        (lambda: client.generate(model="default", prompt="x", options={"repeat_penalty": 0}), "repeat_penalty"),
        (lambda: client.generate(model="default", prompt="x", context=[10**9]), "context"),
    ):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 400 and field in str(e.value.error), e.value.error


def test_load_requests_and_the_token(client, daemon):
    assert client.generate(model="default").done_reason == "load"
    assert client.chat(model="default", messages=[]).done_reason == "load"
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=daemon.url, timeout=30).list()  # no token: refused by default
    assert e.value.status_code == 401
