"""Every sampling parameter, any value (issue 20 item 6): on chat completions, completions and Ollama's chat
and generate options, on both backends, a property test draws values over the whole JSON number domain (NaN
and infinities as Python's JSON writes them, denormals, huge integers and floats, zero, negatives, the
bounds and just past them) and sends them through the daemon's HTTP interface (in-process, so hundreds of
cases stay cheap). Each answer is a reply when every value is within the option's documented domain
(engine/sampling_params.py), else a 400 whose message names an option that was sent; never a 5xx."""

from __future__ import annotations

import json
import math

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engramctl.daemon.app import create_app
from engramctl.engine.sampling_params import OPTIONS
from engramctl.settings import load_settings
from engramctl.store.store import Store
from tests.backends import both_backends
from tests.factory import VOCAB

pytestmark = both_backends

TOKEN = "domain-token"
OPENAI = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "seed")
OLLAMA = OPENAI  # Ollama's options by the same names (it has no logit_bias)

EDGES = [0, 0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1e-300, 0.5, 1, 1.0, 2, 2.0000000000000004]
EDGES += [-1, -2, -2.0000000000000004, 100, 100.5, -100, -101, 1e308, -1e308, 2**63, -(2**63) - 1, 2**80]
NUMBERS = st.one_of(
    st.floats(),  # everything, NaN and infinities included
    st.integers(-(2**90), 2**90),
    st.sampled_from(EDGES + [math.nan, math.inf, -math.inf]),
)


def _valid(name: str, value) -> bool:
    """Whether `value` is within the option's documented domain (its JSON Schema)."""
    schema = OPTIONS[name]
    if name == "logit_bias":
        return all(int(k) < VOCAB and _in_bounds(v, schema["additionalProperties"]) for k, v in value.items())
    return _in_bounds(value, schema)


def _in_bounds(value, schema) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return False
    if schema["type"] == "integer" and isinstance(value, float):
        # an integer option written as a float: whole, and within 64 bits (pydantic's limit for floats)
        if not (value.is_integer() and -(2.0**63) < value < 2.0**63):
            return False
    if "minimum" in schema and value < schema["minimum"]:
        return False
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        return False
    return not ("maximum" in schema and value > schema["maximum"])


def _options(names) -> st.SearchStrategy[dict]:
    return st.dictionaries(st.sampled_from(names), NUMBERS, min_size=1, max_size=3)


BIAS = st.dictionaries(st.integers(0, VOCAB + 50).map(str), NUMBERS, min_size=1, max_size=3)
CASES = st.one_of(
    st.tuples(st.just("chat"), _options(OPENAI)),
    st.tuples(st.just("completions"), _options(OPENAI)),
    st.tuples(st.just("chat"), st.fixed_dictionaries({"logit_bias": BIAS})),
    st.tuples(st.just("completions"), st.fixed_dictionaries({"logit_bias": BIAS})),
    st.tuples(st.just("ollama-chat"), _options(OLLAMA)),
    st.tuples(st.just("ollama-generate"), _options(OLLAMA)),
)


def _request(route: str, options: dict) -> tuple[str, dict]:
    user = [{"role": "user", "content": "hi"}]
    if route == "chat":
        return "/v1/chat/completions", {"messages": user, "max_tokens": 2, **options}
    if route == "completions":
        return "/v1/completions", {"prompt": "Once upon", "max_tokens": 2, **options}
    opts = {**options, "num_predict": 2}
    if route == "ollama-chat":
        return "/api/chat", {"model": "m", "messages": user, "stream": False, "options": opts}
    return "/api/generate", {"model": "m", "prompt": "Once upon", "stream": False, "options": opts}


def _reply(route: str, body: dict) -> str:
    if route == "chat":
        return body["choices"][0]["message"]["content"]
    if route == "completions":
        return body["choices"][0]["text"]
    assert body["done"] is True and body["eval_count"] >= 1
    return body["message"]["content"] if route == "ollama-chat" else body["response"]


@pytest.fixture(scope="module")
def client(backend, tiny_engine, tmp_path_factory):
    home = tmp_path_factory.mktemp("domain-home")
    s = load_settings({"api_key": TOKEN}, env={"ENGRAM_HOME": str(home)})
    s.paths.ensure()
    app = create_app(s, engine=tiny_engine(backend), store=Store.open(s))
    with TestClient(app, raise_server_exceptions=False, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c
    app.state.daemon.close()


def test_every_sampling_value_is_a_reply_or_a_400_naming_it(client):
    seen: dict[int, int] = {}

    @settings(max_examples=150, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(CASES)
    def one(case):
        route, options = case
        path, body = _request(route, options)
        r = client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        valid = all(_valid(name, value) for name, value in options.items())
        if valid:
            assert r.status_code == 200, (route, options, r.text)
            assert isinstance(_reply(route, r.json()), str)
        else:
            assert r.status_code == 400, (route, options, r.text)
            message = r.json()["error"]["message"]
            assert any(name in message for name in options), (route, options, message)

    one()
    assert seen.get(200, 0) >= 20 and seen.get(400, 0) >= 20, seen  # both sides of the domain were exercised
    assert set(seen) <= {200, 400}, seen


def test_a_denormal_repeat_penalty_is_a_reply_not_a_500(client):
    """Regression (issue 20): repeat_penalty 5e-324 on /v1/chat/completions answered 500 ("probability tensor
    contains either inf, nan or element < 0"); with every sampler after it, on every route."""
    for route in ("chat", "completions", "ollama-chat", "ollama-generate"):
        for extra in ({}, {"temperature": 0}, {"temperature": 5e-324, "top_p": 5e-324}, {"min_p": 1, "top_k": 1}):
            path, body = _request(route, {"repeat_penalty": 5e-324, **extra})
            r = client.post(path, json=body)
            assert r.status_code == 200, (route, extra, r.text)
            assert isinstance(_reply(route, r.json()), str)
