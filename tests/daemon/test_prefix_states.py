"""Prefix states (daemon/prefix_states.py): a new conversation that begins like earlier ones starts from the
state kept at their common prefix (the end of the system prompt, a user message's start), on hybrid, pure
recurrent and attention-only models, on both backends, from every door, after a restart too; several new
conversations arriving together compute the shared prefix once. In-process daemon, the official clients."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.backends import BACKENDS
from tests.helpers.inprocess import InProcessDaemon

SYSTEM = {"role": "system", "content": "You are a terse assistant for a travel agency. " * 6}
FAMILIES = ("granitemoehybrid", "mamba2", "llama")  # hybrid, pure recurrent, attention-only


@pytest.fixture(scope="module")
def engines(served_model):
    """(backend, family) -> an Engine on that tiny model, loaded once for the module."""
    from engramctl.engine.loading import load_engine

    cache: dict = {}

    def get(backend: str, family: str):
        if (backend, family) not in cache:
            path = served_model(backend, family)
            cache[backend, family] = load_engine(
                str(path), path.parent, "cpu", "float32", backend=backend, model_id=f"tiny-{family}"
            )
        return cache[backend, family]

    return get


def _system_tokens(engine) -> int:
    tok = engine.tokenizer
    return len(tok.encode(tok.render([SYSTEM], add_generation_prompt=False)))


def _ask(oai, question: str, **extra) -> dict:
    r = oai.chat.completions.create(
        model="m",
        messages=[SYSTEM, {"role": "user", "content": question}],
        max_tokens=3,
        temperature=0,
        **extra,
    )
    return r.model_extra["engram"] | {"usage": r.usage}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_new_conversation_starts_from_the_system_prompts_state(engines, engram_home, backend, family):
    engine = engines(backend, family)
    n_system = _system_tokens(engine)
    with InProcessDaemon(engine) as d:
        oai, h = d.clients()
        first = _ask(oai, "Where should I go in May?")
        assert first["cached_tokens"] == 0
        second = _ask(oai, "And what about a cheap weekend trip by train?")
        assert second["cached_tokens"] == n_system  # the system prompt's state, kept by the first
        assert second["usage"].prompt_tokens_details.cached_tokens == n_system
        third = _ask(oai, "Name one museum.", extra_body={"session": "named"})  # a named session's first turn
        assert third["cached_tokens"] == n_system
        h.close()


def test_every_door_starts_from_a_kept_prefix(engines, engram_home):
    import ollama

    engine = engines("llama.cpp", "granitemoehybrid")
    n_system = _system_tokens(engine)
    with InProcessDaemon(engine) as d:
        oai, h = d.clients()
        _ask(oai, "First question?")
        ol = ollama.Client(host=d.url, headers={"Authorization": f"Bearer {d.daemon.token}"})
        r = ol.chat(model="m", messages=[SYSTEM, {"role": "user", "content": "From Ollama?"}], options={"num_predict": 3})
        assert r.prompt_eval_count is not None
        tok = engine.tokenizer
        prompt_ids = tok.encode(tok.render([SYSTEM, {"role": "user", "content": "From Ollama?"}]))
        assert r.prompt_eval_count == len(prompt_ids) - n_system  # Ollama counts what it evaluated
        text = tok.render([SYSTEM], add_generation_prompt=False) + "A raw continuation"
        c = oai.completions.create(model="m", prompt=text, max_tokens=2, temperature=0)
        assert c.usage.prompt_tokens_details.cached_tokens == n_system
        h.close()


def test_kept_prefixes_survive_a_restart(engines, engram_home):
    engine = engines("llama.cpp", "granitemoehybrid")
    n_system = _system_tokens(engine)
    with InProcessDaemon(engine) as d:
        oai, h = d.clients()
        _ask(oai, "Before the restart?")
        d.store.flush()
        h.close()
    with InProcessDaemon(engine) as d:
        oai, h = d.clients()
        after = _ask(oai, "After the restart, something new?")
        assert after["cached_tokens"] == n_system
        assert after["origin"]["tier"] in ("disk", "ram")
        h.close()


@pytest.mark.parametrize("family", ("granitemoehybrid", "llama"))
def test_conversations_arriving_together_compute_the_shared_prefix_once(engines, engram_home, family):
    engine = engines("llama.cpp", family)
    n_system = _system_tokens(engine)
    with InProcessDaemon(engine) as d:
        oai, h = d.clients()
        questions = [f"Question number {i}, about somewhere else?" for i in range(4)]
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda q: _ask(oai, q), questions))
        computed = sorted(a["computed_tokens"] for a in answers)
        prompts = [a["usage"].prompt_tokens for a in answers]
        # one of them computed the system prompt; the other three only their own question
        assert sum(computed) == sum(prompts) - 3 * n_system
        assert sorted(a["cached_tokens"] for a in answers) == [0, n_system, n_system, n_system]
        h.close()
