"""Structured output in the engine (engine/constraint.py through the Sampler): with the grammar masking the
logits, even a random-weight model's reply parses and validates against the schema, on both backends; what
the grammar cannot enforce is refused by name before anything is generated."""

import json

import jsonschema
import pytest
import numpy as np
import torch

from engramctl.engine.constraint import JSON_OBJECT, Constraint, check, grammar_spec, ll_tokenizer
from engramctl.engine.sampling import Sampler, SamplingParams
from engramctl.engine.turn import Turn
from engramctl.errors import UnsupportedSchema, UsageError
from tests.backends import both_backends

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "mood": {"enum": ["calm", "busy"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "home": {
            "type": "object",
            "properties": {"x": {"type": "boolean"}},
            "required": ["x"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "mood", "age", "tags", "home"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe someone as JSON."}]


def _reply(engine, spec: str, seed: int, max_tokens: int = 160):
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens, grammar=spec)
    return Turn.for_messages(engine, engine.new_live(), ASK, params).run()


def test_a_spec_is_the_schema_s_compact_json_in_its_own_order():
    schema = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    spec = grammar_spec(schema)
    assert json.loads(spec) == schema and list(json.loads(spec)["properties"]) == ["b", "a"] and " " not in spec
    assert grammar_spec(JSON_OBJECT) == JSON_OBJECT
    with pytest.raises(UnsupportedSchema, match="JSON object"):
        grammar_spec(["not", "a", "schema"])


@pytest.mark.parametrize(
    "schema, feature",
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"not": {"type": "string"}}, "not"),
        ({"if": {"type": "string"}, "then": {"minLength": 1}}, "if"),
        ({"type": "object", "propertyNames": {"pattern": "^a"}}, "propertyNames"),
        ({"type": "strin"}, "strin"),
        ({"type": "string", "pattern": "(?=a)b"}, "look-around"),
        ({"$ref": "http://example.org/s.json"}, "http://example.org/s.json"),
    ],
)
def test_what_the_grammar_cannot_enforce_is_refused_naming_the_feature(schema, feature):
    with pytest.raises(UnsupportedSchema) as got:
        check(grammar_spec(schema))
    assert feature in got.value.message and isinstance(got.value, UsageError) and got.value.status == 400


@both_backends
@pytest.mark.parametrize("seed", [0, 1])
def test_a_random_model_s_constrained_reply_validates(backend, tiny_engine, seed):
    engine = tiny_engine(backend)
    done = _reply(engine, grammar_spec(PERSON), seed)
    assert done.finish.reason == "stop", done.finish.text  # ended by its end-of-turn token
    assert done.finish.token_ids[-1] in engine.tokenizer.eos_ids
    jsonschema.validate(json.loads(done.finish.text), PERSON)


@both_backends
def test_json_object_gives_an_object_and_a_cut_reply_is_a_prefix_of_one(backend, tiny_engine):
    engine = tiny_engine(backend)
    done = _reply(engine, JSON_OBJECT, 3, max_tokens=60)
    if done.finish.reason == "stop":
        assert isinstance(json.loads(done.finish.text), dict)
    else:  # a random model may ramble on in an open object: still an object's prefix
        assert done.finish.reason == "length" and done.finish.text.startswith("{")
    cut = _reply(engine, grammar_spec(PERSON), 0, max_tokens=3)
    assert cut.finish.reason == "length" and cut.finish.text.startswith('{"')
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.finish.text)


@both_backends
def test_the_grammar_holds_when_the_scores_say_nothing(backend, tiny_engine):
    """NaN logits everywhere: sample() draws from the whole vocabulary; the constraint still picks an
    allowed token, and only end-of-turn ids once the value is complete."""
    engine = tiny_engine(backend)
    tok = engine.tokenizer
    sampler = Sampler(SamplingParams(temperature=0.7, seed=5, grammar=grammar_spec({"enum": ["ab"]})), tok)
    n = engine.new_live().last_logits
    vocab = len(tok.hf) if hasattr(tok, "hf") else tok.n_vocab
    logits = torch.full((vocab if n is None else n.numel(),), float("nan"))
    out = []
    for _ in range(12):
        token = sampler.pick(logits)
        sampler.accept(token)
        out.append(token)
        if token in tok.eos_ids:
            break
    assert out[-1] in tok.eos_ids
    assert tok.decode(out[:-1]) == '"ab"'


def test_the_mask_covers_logits_past_the_tokenizer_s_vocabulary(tiny_engine):
    """A model whose logits outnumber its tokenizer's ids (the 350M preset's 100352 over 512): those ids
    are never allowed."""
    tok = tiny_engine("transformers").tokenizer
    c = Constraint(grammar_spec({"type": "integer"}), tok)
    n = ll_tokenizer(tok).vocab_size
    masked = c.mask(torch.zeros(n + 100))
    assert masked.shape == (n + 100,) and np.isinf(masked[n:]).all()
    allowed = [t for t in range(n) if masked[t] == 0]
    assert allowed and all(tok.decode([t]).strip("-0123456789") == "" for t in allowed)


def test_the_reply_writes_properties_in_the_schema_s_order(tiny_engine):
    engine = tiny_engine("transformers")
    schema = {
        "type": "object",
        "properties": {"z": {"enum": [1]}, "a": {"enum": [2]}},
        "required": ["z", "a"],
        "additionalProperties": False,
    }
    done = _reply(engine, grammar_spec(schema), 0, max_tokens=40)
    assert done.finish.text == '{"z":1,"a":2}'
