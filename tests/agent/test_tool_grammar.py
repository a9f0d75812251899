"""agent/tool_grammar.py without a daemon: the grammar of each tool_choice walked with random logits through the
engine's Constraint on the tiny model's tokenizer (whatever the scores, what comes out parses into calls that
validate, or is text that opens none), tool_choice's checks, closed objects, and refusals naming the tool."""

from __future__ import annotations

import numpy as np
import pytest

from engramctl.agent.calls import TOOL_CALL_OPEN, parse_tool_calls, request_tools
from engramctl.agent.tool_grammar import check_tools, closed, tool_choice, tool_grammar
from engramctl.engine.constraint import Constraint
from engramctl.errors import UnsupportedSchema, UsageError
from tests.daemon.tool_fixtures import NAMED, TOOLS, WEATHER, check_calls


@pytest.fixture(scope="module")
def tok(tiny_engine):
    return tiny_engine("transformers").tokenizer


def _walk(spec: str, tok, seed: int, prefix: str = "", eos_after: int = 10**9) -> str:
    """A reply written by random scores under the grammar (after `prefix`, fed as is), up to 300 tokens."""
    rng = np.random.default_rng(seed)
    c = Constraint(spec, tok)
    ids = tok.encode(prefix) if prefix else []
    for t in ids:
        assert c.allowed(len(tok.hf))[t], "the grammar refused the prefix"
        c.advance(t)
    eos = sorted(tok.eos_ids)
    for step in range(300):
        logits = rng.normal(size=len(tok.hf)).astype(np.float32) * 3
        if step > eos_after:
            logits[eos] += 30
        t = c.choose(int(np.argmax(c.mask(logits))))
        if t in eos:
            break
        c.advance(t)
        ids.append(t)
    return tok.decode(ids)


@pytest.mark.parametrize("choice, parallel", [("required", True), ("required", False), (NAMED, True)])
def test_forced_replies_are_valid_calls_whatever_the_scores(tok, choice, parallel):
    tools = request_tools(TOOLS)
    spec = tool_grammar(tools, tool_choice(choice, tools), parallel)
    named = choice["function"]["name"] if isinstance(choice, dict) else None
    for seed in range(3):
        text = _walk(spec, tok, seed, eos_after=40)
        content, calls = parse_tool_calls(text, tools.names)
        assert content == "" and text.startswith(TOOL_CALL_OPEN), text
        check_calls([(c.name, c.arguments) for c in calls], named)
        if named or not parallel:
            assert len(calls) == 1, text


def test_auto_holds_a_started_call_to_the_tools_and_none_never_starts_one(tok):
    tools = request_tools(TOOLS)
    for parallel in (True, False):
        spec = tool_grammar(tools, tool_choice("auto", tools), parallel)
        text = _walk(spec, tok, 7, prefix=f"Let me look.\n{TOOL_CALL_OPEN}", eos_after=60)
        content, calls = parse_tool_calls(text, tools.names)
        assert content == "Let me look." and calls, text
        check_calls([(c.name, c.arguments) for c in calls])
        if not parallel:
            assert text.count(TOOL_CALL_OPEN) == 1
    none = tool_grammar(tools, tool_choice("none", tools))
    c = Constraint(none, tok)
    for t in tok.encode("<tool_call"):
        c.advance(t)
    assert not c.allowed(len(tok.hf))[tok.encode(">")[0]]  # the tag cannot be completed


def test_tool_choice_is_checked_against_the_tools():
    tools = request_tools(TOOLS)
    assert tool_choice(None, tools).mode == "auto" and tool_choice(NAMED, tools).name == "add"
    for bad, param in ((("banana"), "tool_choice"), ({"function": {"name": "x"}}, "tool_choice.function.name")):
        with pytest.raises(UsageError) as e:
            tool_choice(bad, tools)
        assert e.value.param == param and e.value.message.startswith(param)


def test_objects_are_closed_unless_the_schema_says_otherwise():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}},
        "$defs": {"d": {"properties": {"x": {}}}},
        "anyOf": [{"properties": {"y": {}}}],
    }
    out = closed(schema)
    assert out["additionalProperties"] is False and out["properties"]["a"]["additionalProperties"] is False
    assert out["$defs"]["d"]["additionalProperties"] is False and out["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the request's schema is not changed
    kept = {"properties": {}, "additionalProperties": {"type": "integer"}}
    assert closed(kept)["additionalProperties"] == {"type": "integer"}
    assert "additionalProperties" not in closed({"properties": {}, "allOf": [{"properties": {"z": {}}}]})


def test_a_schema_the_grammar_cannot_enforce_is_refused_naming_the_tool():
    bad = {
        **WEATHER,
        "function": {
            **WEATHER["function"],
            "parameters": {"type": "object", "properties": {"t": {"type": "array", "uniqueItems": True}}},
        },
    }
    with pytest.raises(UnsupportedSchema) as e:
        check_tools(request_tools([TOOLS[1], bad]))
    assert e.value.param == "tools[1].function.parameters" and "uniqueItems" in e.value.message


def test_parameters_that_are_not_an_object_are_refused():
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
    with pytest.raises(UnsupportedSchema) as e:
        check_tools(request_tools([bad]))
    assert e.value.param == "tools[0].function.parameters" and '"type": "object"' in e.value.message
