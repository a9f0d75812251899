"""What a reply may be when a request declares tools, as a grammar the engine enforces token by token
(engine/constraint.py, llguidance's Lark dialect), so every tool call the model writes is well formed, names
a declared function and carries arguments that validate against that function's `parameters`.

The calls are written as calls.py asks the model to write them (and renders them back in a history):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Oslo"}}
    </tool_call>

one block per call, consecutive calls separated by a newline. By `tool_choice`:
- "auto": free text, or text up to "<tool_call>" and then whole valid calls (one at most when
  parallel_tool_calls is false) and nothing after them: what calls.plain_messages renders back;
- "required": the reply is one call or more (exactly one when parallel_tool_calls is false), nothing else;
- a named function: exactly one call, to that function;
- "none": text that never opens a call (the model still sees the tools: the conversation's prompt stays the
  same whatever a turn's tool_choice, so the next turn continues from this one's state).

Each call's JSON is literal text around the arguments' own JSON Schema (`%json`), so a schema's `$ref`s
resolve within it as written. Separators are json.dumps' (", " and ": "), which calls.call_text uses too: a
call sent back in the next request's history renders to the very text the model generated, so the stored
state still holds that conversation's prefix. A schema the grammar cannot enforce is refused up front
(UnsupportedSchema naming `tools[i].function.parameters` and the keyword).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engramctl.agent.calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, RequestTools
from engramctl.engine.constraint import check, lark_spec
from engramctl.errors import UnsupportedSchema, UsageError

# json.dumps' separators (calls.call_text writes a call with them), no other whitespace
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
# Free text that does not hold the opening tag: the text around calls in "auto" (the tag starts a call)
_TEXT = f"/(?s:.*)/ & ~/(?s:.*){TOOL_CALL_OPEN}(?s:.*)/"


@dataclass(frozen=True)
class ToolChoice:
    """A request's tool_choice: mode "auto", "none", "required" or "function" (then `name` is the one)."""

    mode: str
    name: str | None = None


def tool_choice(value: Any, tools: RequestTools) -> ToolChoice:
    """OpenAI's tool_choice (absent: "auto"), checked against the declared tools; UsageError names the field."""
    if value is None or value == "auto":
        return ToolChoice("auto")
    if value in ("none", "required"):
        return ToolChoice(value)
    if isinstance(value, dict):
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if value.get("type", "function") == "function" and isinstance(name, str):
            if name not in tools.names:
                known = ", ".join(sorted(tools.names)) or "none"
                raise _choice_error(f"tool_choice.function.name: {name!r} is not among the request's tools ({known}).")
            return ToolChoice("function", name)
    raise _choice_error(
        'tool_choice: must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}} '
        f"(got {json.dumps(value)[:60]})."
    )


def _choice_error(message: str) -> UsageError:
    err = UsageError(message)
    err.param = message.split(":", 1)[0]
    return err


def arguments_schema(tool: dict) -> dict:
    """The JSON Schema a call's arguments follow: the function's `parameters` (none: an empty object), its
    objects closed (closed())."""
    params = tool["function"].get("parameters")
    return closed(params) if params else _NO_ARGUMENTS


_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames")


def closed(schema: Any) -> Any:
    """`schema` with every object that lists its properties and says nothing of others taking no others, as
    llama.cpp's and xgrammar's grammars read a schema for generation: a small model left free to add keys
    writes key after key (SmolLM2 filled a 2-property pydantic model's call with "temperature_min_max": [...]
    until max_tokens). A schema that says additionalProperties (or patternProperties) keeps its word; allOf
    branches are left open (closing each would refuse what the others add). `strict: true` asks the same."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(v) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(v) for v in out[key]]
    for key in _SCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = closed(out["additionalProperties"])
    said = any(k in out for k in ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf"))
    if isinstance(out.get("properties"), dict) and not said:
        out["additionalProperties"] = False
    return out


def _json_in_lark(schema: dict) -> str:
    # llguidance reads its options from the schema's "x-guidance": ours replace any a request sent
    return "%json " + json.dumps({**schema, "x-guidance": _JSON_OPTIONS}, ensure_ascii=False)


def _lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _call_rule(i: int, tool: dict) -> str:
    name = tool["function"]["name"]
    head = _lark_string(f'{{"name": "{name}", "arguments": ')
    return f"f{i}: {head} {_json_in_lark(arguments_schema(tool))} " + _lark_string("}")


def check_tools(tools: RequestTools) -> None:
    """Refuse (UnsupportedSchema, param naming the tool) a function whose parameters the grammar cannot enforce."""
    for i, tool in enumerate(tools.declared):
        where = f"tools[{i}].function.parameters"
        kind = arguments_schema(tool).get("type", "object")
        if kind != "object" and not (isinstance(kind, list) and "object" in kind):
            err = UnsupportedSchema(f'{where}: a call\'s arguments are a JSON object: give "type": "object".')
            err.param = where
            raise err
        try:
            check(lark_spec(f"start: {_json_in_lark(arguments_schema(tool))}"))
        except UnsupportedSchema as e:
            err = UnsupportedSchema(f"{where}: {e.message}", e.hint)
            err.param = where
            raise err from None


def tool_grammar(tools: RequestTools, choice: ToolChoice, parallel: bool = True) -> str:
    """The grammar spec (engine/constraint.py) of a reply under `choice`; check_tools first names a bad schema."""
    if choice.mode == "none":
        return lark_spec(f"start: TEXT\nTEXT: {_TEXT}")
    callable_ = [(i, t) for i, t in enumerate(tools.declared) if choice.mode != "function" or _name(t) == choice.name]
    open_, close = _lark_string(TOOL_CALL_OPEN + "\n"), _lark_string("\n" + TOOL_CALL_CLOSE)
    lines = [
        f"body: {' | '.join(f'f{i}' for i, _ in callable_)}",
        *(_call_rule(i, t) for i, t in callable_),
    ]
    newline = _lark_string("\n")
    many = parallel and choice.mode in ("auto", "required")
    more = f" ({newline} call)*" if many else ""
    lines += [f"call: {open_} body {close}"]
    if choice.mode == "auto":  # text without a call, or text up to the tag and then the calls, nothing after
        lines = [
            f"start: TEXT | first{more}",
            f"first: call_hd {newline} body {close}",
            f"call_hd[lazy]: /(?s:.*){TOOL_CALL_OPEN}/",
            f"TEXT: {_TEXT}",
            *lines,
        ]
    else:
        lines = [f"start: call{more}", *lines]
    return lark_spec("\n".join(lines))


def _name(tool: dict) -> str:
    return tool["function"]["name"]
