"""Tool calls the model writes in its reply (the OpenAI tool-call flow on /v1/chat/completions).

When a chat request carries `tools`, the daemon
1. describes them to the model in a system message (`tools_message`, the Hermes/Qwen/Granite
   convention: signatures inside <tools></tools>, calls inside <tool_call></tool_call>), added once per
   conversation;
2. generates the reply as usual, then finds the calls in it (`parse_tool_calls`): a JSON object
   {"name": ..., "arguments": {...}} (or "parameters"), alone, in a ```json fence, inside
   <tool_call>...</tool_call> (closing tag optional), after [TOOL_CALLS], or a list of them; only
   names declared in the request's `tools` count;
3. executes the calls to engram tools (tools.STATE_TOOLS) in the conversation's session and answers
   with an assistant message carrying `tool_calls` plus, in the `engram` extension, the results as
   ready-to-append `{"role": "tool", ...}` messages. Calls to the client's own functions are returned
   unexecuted, as OpenAI does (finish_reason "tool_calls").

`plain_messages` renders a request's assistant tool_calls and tool results back into text the chat
template can show the model. Nothing heavy is imported here.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Collection, Iterable

from engramctl.agent.tools import STATE_TOOLS
from engramctl.errors import UsageError

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_FENCE = re.compile(r"^```(?:json|tool_call|tool_code)?\s*\n?(.*?)\n?```$", re.S)
_MISTRAL = "[TOOL_CALLS]"

TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass
class ParsedCall:
    name: str
    arguments: dict | None  # None when they were not a JSON object (see error)
    raw_arguments: str  # the JSON string OpenAI's tool_calls carry
    error: str | None = None
    id: str = field(default_factory=lambda: f"call_{secrets.token_hex(12)}")

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.raw_arguments}}


@dataclass(frozen=True)
class RequestTools:
    """The request's `tools`, split into engram tools (the daemon runs them) and the client's own."""

    declared: tuple[dict, ...]  # the tool objects as given, for the prompt
    engram: frozenset[str]
    client: frozenset[str]

    @property
    def names(self) -> frozenset[str]:
        return self.engram | self.client


def _refused(field: str, problem: str) -> UsageError:
    err = UsageError(f"{field}: {problem}")
    err.param = field
    return err


def request_tools(tools: Iterable[Any]) -> RequestTools:
    """Check the shape of a request's `tools` (OpenAI function tools, which Ollama's are too); UsageError
    names the bad entry (`param`)."""
    declared, engram, client = [], set(), set()
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise _refused(f"tools[{i}]", 'only function tools are supported ({"type": "function", ...}).')
        fn = t.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise _refused(f"tools[{i}].function.name", "must be 1-64 letters, digits, '_', '.' or '-'.")
        if name in engram or name in client:
            raise _refused(f"tools[{i}].function.name", f"{name!r} is declared twice.")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise _refused(f"tools[{i}].function.parameters", "must be a JSON Schema object.")
        (engram if name in STATE_TOOLS else client).add(name)
        declared.append({"type": "function", "function": fn})
    return RequestTools(tuple(declared), frozenset(engram), frozenset(client))


def tools_message(tools: RequestTools) -> dict[str, str]:
    """The system message that tells the model which functions it may call and how."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False, separators=(", ", ": ")) for t in tools.declared)
    return {"role": "system", "content": TOOLS_PROMPT.format(tools=lines)}


def with_tools_message(messages: list[dict], transcript: list[dict], prompt: dict) -> list[dict]:
    """`messages` with the tools system message added unless the conversation already has it: first for
    a new conversation, right after the stored part when the request repeats it, else before the new ones."""
    if prompt in messages or any(
        m.get("role") == "system" and m.get("content") == prompt["content"] for m in transcript
    ):
        return list(messages)
    stored = [{"role": str(m.get("role")), "content": str(m.get("content") or "")} for m in transcript]
    n = len(stored)
    if n and messages[:n] == stored:
        return messages[:n] + [prompt] + messages[n:]
    return [prompt] + list(messages)


# -- parsing -------------------------------------------------------------------------------------------------
def _objects(text: str) -> list[tuple[int, int, Any]]:
    """Every top-level JSON object or array in `text`: (start, end, value)."""
    dec = json.JSONDecoder()
    out, i = [], 0
    while True:
        starts = [j for j in (text.find("{", i), text.find("[", i)) if j >= 0]
        if not starts:
            return out
        j = min(starts)
        try:
            value, end = dec.raw_decode(text, j)
        except json.JSONDecodeError:
            i = j + 1
            continue
        out.append((j, end, value))
        i = end


def _as_call(obj: Any, names: Collection[str]) -> ParsedCall | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}} (OpenAI's own shape)
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or name not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if args is None:
        args = {}
    if isinstance(args, str):
        raw = args
        try:
            decoded = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return ParsedCall(name, None, raw, f"arguments: not valid JSON ({e.msg}).")
        if not isinstance(decoded, dict):
            return ParsedCall(name, None, raw, "arguments: must be a JSON object.")
        return ParsedCall(name, decoded, raw)
    if not isinstance(args, dict):
        return ParsedCall(name, None, json.dumps(args), "arguments: must be a JSON object.")
    return ParsedCall(name, args, json.dumps(args, ensure_ascii=False))


def _calls_in(value: Any, names: Collection[str]) -> list[ParsedCall] | None:
    """The calls a decoded JSON value holds (an object, or a list of objects), or None if it is not calls."""
    items = value if isinstance(value, list) else [value]
    calls = [_as_call(v, names) for v in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def parse_tool_calls(text: str, names: Collection[str]) -> tuple[str, list[ParsedCall]]:
    """(the reply's text outside the calls, the calls), for the function names in `names`."""
    names = frozenset(names)
    if not names or not text:
        return text, []
    if TOOL_CALL_OPEN in text:
        calls: list[ParsedCall] = []
        for m in _TAGGED.finditer(text):
            body = m.group(1).strip()
            fenced = _FENCE.match(body)
            body = fenced.group(1).strip() if fenced else body
            for _, _, value in _objects(body):
                calls.extend(_calls_in(value, names) or [])
        if calls:
            return _TAGGED.sub("", text).strip(), calls
        return text, []
    stripped = text.strip()
    if stripped.startswith(_MISTRAL):
        stripped = stripped[len(_MISTRAL) :].strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    if stripped[:1] in "{[":  # the whole reply is the call(s)
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            value = None
        found = _calls_in(value, names) if value is not None else None
        if found:
            return "", found
    # calls embedded in prose: objects naming a declared function with arguments/parameters
    calls, kept, pos = [], [], 0
    for start, end, value in _objects(text):
        if isinstance(value, dict) and ("arguments" in value or "parameters" in value or "function" in value):
            found = _calls_in(value, names)
            if found:
                calls.extend(found)
                kept.append(text[pos:start])
                pos = end
    if not calls:
        return text, []
    kept.append(text[pos:])
    return re.sub(r"```(?:json)?\s*```", "", "".join(kept)).strip(), calls


# -- messages ------------------------------------------------------------------------------------------------
def call_text(name: str, arguments: Any) -> str:
    """A call as the model writes it (what `tools_message` asks for)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def assistant_text(content: str, calls: Any) -> str:
    """An assistant message with tool calls (OpenAI's arguments as a JSON string, Ollama's as an object) as
    the model wrote it: its text, then one <tool_call> block per call."""
    blocks = []
    for c in calls if isinstance(calls, list) else []:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            blocks.append(call_text(fn["name"], fn.get("arguments", {})))
    return "\n".join(([content] if content else []) + blocks)


def plain_messages(messages: Iterable[Any]) -> list[dict[str, str]]:
    """Request messages (schemas.ChatMessage) as role/content dicts for the chat template, with an
    assistant's tool_calls written back as <tool_call> blocks so the model sees what it called."""
    out = []
    for m in messages:
        msg = m.plain()
        calls = (m.model_extra or {}).get("tool_calls")
        if m.role == "assistant" and calls:
            msg["content"] = assistant_text(msg["content"], calls)
        out.append(msg)
    return out


def tool_message(call: ParsedCall, content: Any) -> dict[str, str]:
    """The `{"role": "tool"}` message answering `call` (content: the result or {"error": ...} as JSON)."""
    return {
        "role": "tool",
        "tool_call_id": call.id,
        "name": call.name,
        "content": content if isinstance(content, str) else json.dumps(content, ensure_ascii=False),
    }
