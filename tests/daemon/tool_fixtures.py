"""Tools the tool-call tests declare, and the checks every answer's calls must pass: each call names a declared
function (the named one, when tool_choice names one) and its arguments validate against that function's
`parameters` (jsonschema). Bounded schemas (maxLength, enums, integer bounds, additionalProperties false) so a
random-weight model's forced call ends within a small max_tokens."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "$defs": {"small": {"type": "integer", "minimum": -999, "maximum": 999}},
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/small"}, "b": {"$ref": "#/$defs/small"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
NAMED = {"type": "function", "function": {"name": "add"}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def check_calls(calls: list[tuple[str, Any]], named: str | None = None) -> None:
    """(name, arguments) pairs, arguments as OpenAI's JSON string or Ollama's object: each validates."""
    assert calls, "no tool call"
    for name, arguments in calls:
        assert name in SCHEMAS and (named is None or name == named), (name, named)
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
        jsonschema.validate(args, SCHEMAS[name])


def openai_calls(r) -> list[tuple[str, str]]:
    """The calls of a (non-streamed) openai ChatCompletion."""
    return [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls or []]


def streamed_calls(chunks) -> tuple[list[tuple[str, str]], str | None, str]:
    """(calls, finish_reason, content) of a streamed openai completion, its tool_call deltas joined by index."""
    calls: dict[int, list[str]] = {}
    finish, content = None, ""
    for c in chunks:
        if not c.choices:
            continue
        delta = c.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            slot = calls.setdefault(tc.index, ["", ""])
            slot[0] += (tc.function.name or "") if tc.function else ""
            slot[1] += (tc.function.arguments or "") if tc.function else ""
        finish = c.choices[0].finish_reason or finish
    return [(n, a) for n, a in (calls[i] for i in sorted(calls))], finish, content
