"""Prefix states (daemon/prefix_states.py): a new conversation that begins like earlier ones starts from the
state kept at their common prefix (the end of the system prompt, a user message's start), on hybrid, pure
recurrent and attention-only models, on both backends, from every door, after a restart too; several new
conversations arriving together compute the shared prefix once. In-process daemon, the official clients."""

from __future__ import annotations

import threading
import time
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
        r = ol.chat(
            model="m", messages=[SYSTEM, {"role": "user", "content": "From Ollama?"}], options={"num_predict": 3}
        )
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
        assert after["tier"] in ("disk", "ram") and after["restored_tokens"] == n_system
        h.close()


@pytest.mark.parametrize("family", ("granitemoehybrid", "llama"))
def test_conversations_arriving_together_compute_the_shared_prefix_once(engines, engram_home, family):
    engine = engines("llama.cpp", family)
    n_system = _system_tokens(engine)
    with InProcessDaemon(engine) as d:
        oai, h = d.clients()
        questions = [f"Question number {i}, about somewhere else?" for i in range(4)]
        worker, gate = d.daemon.worker, threading.Event()
        with ThreadPoolExecutor(5) as pool:
            held = pool.submit(worker.call, lambda: gate.wait(60))  # the worker is busy: the four queue up
            asked = [pool.submit(_ask, oai, q) for q in questions]
            deadline = time.monotonic() + 60
            while worker.waiting < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert worker.waiting == 4  # they arrive together: admitted in one pass
            gate.set()
            held.result()
            answers = [a.result() for a in asked]
        computed = sorted(a["computed_tokens"] for a in answers)
        prompts = [a["usage"].prompt_tokens for a in answers]
        # one of them computed the system prompt; the other three only their own question
        assert sum(computed) == sum(prompts) - 3 * n_system
        assert sorted(a["cached_tokens"] for a in answers) == [0, n_system, n_system, n_system]
        h.close()


def _reply_state(engine, question: str, first: str | None) -> dict:
    """The tensors of session b's reply snapshot, after session a (asking `first`) kept the system prompt's
    state in the same daemon; with first None, b runs alone on a new store."""
    import numpy as np

    with InProcessDaemon(engine) as d:
        oai, h = d.clients()
        if first is not None:
            _ask(oai, first, extra_body={"session": "a"})
        ext = _ask(oai, question, extra_body={"session": "b"})
        assert ext["cached_tokens"] == (0 if first is None else _system_tokens(engine))
        tensors, _meta = d.store.snapshots.load(ext["snapshot_id"])
        h.close()
        return {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v).copy() for k, v in tensors.items()}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ("granitemoehybrid", "mamba2"))
def test_a_conversation_from_a_prefix_state_is_bitwise_its_solo_run(engines, tmp_path, monkeypatch, backend, family):
    """The state kept at another conversation's stop, stored and restored, then the rest fed in the chunks its
    own stops cut: bitwise the state (and last logits) of the conversation run alone, which stops there too."""
    engine = engines(backend, family)
    question = "Which coast is warmest in October, and why?"
    shared = _reply_state(engine, question, first="Something else first?")
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "solo-home"))
    solo = _reply_state(engine, question, first=None)
    assert shared.keys() == solo.keys()
    for name in solo:
        assert shared[name].tobytes() == solo[name].tobytes(), name


def test_a_damaged_prefix_state_is_ignored_and_the_prompt_computed(engines, engram_home):
    engine = engines("llama.cpp", "granitemoehybrid")
    with InProcessDaemon(engine) as d:
        oai, h = d.clients()
        _ask(oai, "Before the damage?")
        d.store.flush()
        (kept,) = d.store.prefixes.list()
        h.close()
    path = engram_home / "snapshots" / f"{kept.id}.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 4  # one bit of its recurrent state, past the header
    path.write_bytes(bytes(data))
    with InProcessDaemon(engine) as d:
        oai, h = d.clients()
        after = _ask(oai, "After the damage?")
        assert after["cached_tokens"] == 0 and after["computed_tokens"] == after["prompt_tokens"]
        assert [p.id for p in d.store.prefixes.list()] != [kept.id]  # dropped (and the prompt kept a new one)
        h.close()


def test_only_a_prompt_that_starts_a_conversation_stops_at_intervals(engines, engram_home):
    """A long message in a conversation that continues its own snapshot keeps no interval states (its turns keep
    two snapshots each); the same prompt starting a conversation does: every INTERVAL_TOKENS."""
    from engramctl.daemon.prefix_states import PrefixStates
    from engramctl.engine.boundaries import INTERVAL_TOKENS

    engine = engines("llama.cpp", "granitemoehybrid")
    with InProcessDaemon(engine) as d:
        prefixes = PrefixStates(engine, d.store)
        feed = list(range(5, 5 + 2 * INTERVAL_TOKENS + 10))
        assert prefixes.stops(None, feed, 0, opens=True) == [INTERVAL_TOKENS, 2 * INTERVAL_TOKENS]
        assert prefixes.stops(None, feed, 0, opens=False) == []
        tok = engine.tokenizer  # a conversation going on: a message starting right after its state is not new
        history = [{"role": "user", "content": "Hello there."}, {"role": "assistant", "content": "Hi."}]
        consumed = tok.render(history[:1], add_generation_prompt=True) + "Hi.<|im_end|>"
        messages = [*history, {"role": "user", "content": "Tell me more, please."}]
        full = tok.render(messages, add_generation_prompt=True)
        assert full.startswith(consumed)
        ids = tok.encode(full)
        start = len(tok.encode(consumed))
        assert ids[:start] == tok.encode(consumed)
        assert prefixes.stops(messages, ids, start, opens=True, held_text=consumed) == [start + 1]  # the "\n"
        assert prefixes.stops(messages, ids, start, opens=True) == [start + 1]  # a state that knows only its ids
        assert prefixes.stops(messages, ids, start, opens=False, held_text=consumed) == []


def test_a_conversation_from_a_prefix_state_keeps_its_later_message_stops(engines, engram_home):
    """A prompt restored from the system prompt's state still keeps a state where its last user message
    starts (the stops are the whole prompt's, from token 0, past the restored start)."""
    engine = engines("llama.cpp", "granitemoehybrid")
    tok = engine.tokenizer
    n_system = _system_tokens(engine)
    longer = [
        SYSTEM,
        {"role": "user", "content": "Where should I go in May?"},
        {"role": "assistant", "content": "Somewhere warm and quiet, by the sea."},
        {"role": "user", "content": "And in June?"},
    ]
    n_last = len(tok.encode(tok.render(longer[:3], add_generation_prompt=False)))
    with InProcessDaemon(engine) as d:
        oai, h = d.clients()
        _ask(oai, "Something else first?")
        r = oai.chat.completions.create(model="m", messages=longer, max_tokens=3, temperature=0)
        assert r.model_extra["engram"]["cached_tokens"] == n_system  # from the system prompt's state
        assert sorted(p.n_tokens for p in d.store.prefixes.list()) == [n_system, n_last]
        again = [*longer[:3], {"role": "user", "content": "And in July, somewhere cheaper?"}]
        r = oai.chat.completions.create(model="m", messages=again, max_tokens=3, temperature=0)
        assert r.model_extra["engram"]["cached_tokens"] == n_last  # a regeneration lands on it
        h.close()


def test_no_prefix_budget_captures_nothing(engines, engram_home):
    engine = engines("llama.cpp", "granitemoehybrid")
    with InProcessDaemon(engine, prefix_state_bytes=0) as d:
        oai, h = d.clients()
        _ask(oai, "First question?")
        second = _ask(oai, "Second question?")
        assert second["cached_tokens"] == 0
        assert d.daemon.service.prefixes.counts()["kept_since_start"] == 0 and d.store.prefixes.list() == []
        h.close()


def test_after_a_dtype_change_prefix_states_of_the_new_dtype_are_kept_and_used(engines, served_model, engram_home):
    """Transformers' fingerprint is dtype-independent: a state of another dtype is not a candidate (the lookup
    covers dtype and state format), so the new dtype keeps and reuses its own."""
    from engramctl.engine.loading import load_engine

    n_system = _system_tokens(engines("transformers", "granitemoehybrid"))
    with InProcessDaemon(engines("transformers", "granitemoehybrid")) as d:
        oai, h = d.clients()
        _ask(oai, "In float32?")
        d.store.flush()
        (f32,) = d.store.prefixes.list()
        h.close()
    path = served_model("transformers", "granitemoehybrid")
    bf16 = load_engine(
        str(path), path.parent, "cpu", "bfloat16", backend="transformers", model_id="tiny-granitemoehybrid"
    )
    assert bf16.info.fingerprint == f32.fingerprint
    with InProcessDaemon(bf16) as d:
        oai, h = d.clients()
        first = _ask(oai, "In bfloat16 now?")
        assert first["cached_tokens"] == 0
        second = _ask(oai, "And again in bfloat16?")
        assert second["cached_tokens"] == n_system
        assert len(d.store.prefixes.list()) == 2  # one per dtype; the float32 one is there for a restart in it
        h.close()


def test_a_refused_prefix_state_is_dropped_not_retried(engines, engram_home):
    """A prefix state whose metadata does not say its dtype passes the lookup but is refused at load: it is
    dropped, and the prompt computes (and keeps) a usable one."""
    engine = engines("llama.cpp", "granitemoehybrid")
    n_system = _system_tokens(engine)
    with InProcessDaemon(engine) as d:
        oai, h = d.clients()
        _ask(oai, "Before?")
        d.store.flush()
        (kept,) = d.store.prefixes.list()
        tensors, meta = d.store.prefixes.load(kept.id, copy=True)
        d.store.prefixes.delete(kept.id)
        unsure = {k: v for k, v in meta.items() if k != "dtype"}
        bad = d.store.prefixes.put(tensors, unsure, tensors["token_ids"].tolist())
        d.store.flush()
        after = _ask(oai, "After?")
        assert after["cached_tokens"] == 0
        assert bad not in {p.id for p in d.store.prefixes.list()}
        assert _ask(oai, "And then?")["cached_tokens"] == n_system  # the usable one kept in its place
        h.close()
