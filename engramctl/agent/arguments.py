"""A tool call's arguments, checked before anything runs: parsed (OpenAI hands them over as a JSON string),
the conversation's session filled in where the tool takes one (Tool.context), names checked by the store's
rules, then the tool's JSON Schema (schema_check.py, over `jsonschema`). A bad argument raises
ToolArgumentError naming the field (`param`).
"""

from __future__ import annotations

import json
from typing import Any

from engramctl.agent.schema_check import check, nullable, type_name
from engramctl.agent.tools import Tool, get_tool
from engramctl.errors import InvalidName, ToolArgumentError
from engramctl.store.names import validate_label, validate_session_name

# Names the store checks beyond the schema (".", ".." and the like), with its own messages.
_NAME_FIELDS = {"session": validate_session_name, "new_session": validate_session_name, "label": validate_label}


def validate_arguments(tool: Tool | str, arguments: Any, *, session: str | None = None) -> dict[str, Any]:
    """The tool's arguments, checked against its schema; `session` (a conversation's) fills in the context
    argument when it is missing. Optional arguments given as null are dropped. Raises ToolArgumentError."""
    tool = get_tool(tool) if isinstance(tool, str) else tool
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):  # OpenAI hands function arguments over as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise ToolArgumentError(f"arguments: not valid JSON ({e.msg} at position {e.pos}).", "arguments") from None
    if not isinstance(arguments, dict):
        raise ToolArgumentError(f"arguments: must be a JSON object (got {type_name(arguments)}).", "arguments")
    args = dict(arguments)
    if session is not None and tool.context and args.get(tool.context) is None:
        args[tool.context] = session
    for key, validator in _NAME_FIELDS.items():
        if key in tool.parameters["properties"] and isinstance(args.get(key), str):
            try:
                validator(args[key])
            except InvalidName as e:
                raise ToolArgumentError(f"{key}: {e.message}", key, e.hint) from None
    props = tool.parameters["properties"]
    # an argument given as null is left out (a required one is then missing), unless null is a value it takes
    args = {k: v for k, v in args.items() if v is not None or k not in props or nullable(props[k])}
    check(tool.parameters, args, "")
    return {k: v for k, v in args.items() if v is not None}
