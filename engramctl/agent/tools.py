"""The agent tools, defined once: name, description, JSON Schema of the arguments and of the result.

Every transport serves these definitions and validates with `validate_arguments` before anything runs:
    GET  /v1/agent/tools          OpenAI function-calling tool objects (Tool.openai())
    POST /v1/agent/call           {"tool": name, "arguments": {...}} -> {"tool": name, "result": {...}}
    WS   /v1/agent/ws             {"type": "call", "tool": name, "arguments": {...}} -> result | error
    MCP  engramctl mcp            tools/list (input and output schemas), tools/call
    chat `tools`                  the model's own calls, executed by the daemon

A conversation transport (a WebSocket connection, the MCP server, a chat turn) knows its session, so
there the `session` argument (`source` for branch) may be left out: Tool.context names that argument.

Bad arguments raise ToolArgumentError naming the field (`param`), before anything is touched.
No heavy imports here: the MCP server and the CLI import this module.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from engramctl.engine.sampling_params import OPTIONS as SAMPLING_OPTIONS
from engramctl.errors import InvalidName, UsageError
from engramctl.store.names import MAX_LABEL_CHARS, MIN_ID_PREFIX, validate_label, validate_session_name


class ToolArgumentError(UsageError):
    """A tool's arguments do not match its schema; `param` names the field."""

    kind = "invalid_arguments"

    def __init__(self, message: str, param: str | None = None, hint: str | None = None):
        super().__init__(message, hint)
        self.param = param


class UnknownTool(UsageError):
    kind = "unknown_tool"

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message, hint)
        self.param = "tool"


# -- schema pieces ----------------------------------------------------------------------------------------
_SESSION_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"


def _session(desc: str) -> dict:
    return {"type": "string", "pattern": _SESSION_PATTERN, "minLength": 1, "maxLength": 64, "description": desc}


_REF = {"type": "string", "minLength": 1, "maxLength": MAX_LABEL_CHARS}
_ID = {"type": "string", "description": "Snapshot id (32 hex digits)."}
_NULLABLE_STR = {"type": ["string", "null"]}
_NULLABLE_NUM = {"type": ["number", "null"]}
_INT = {"type": "integer", "minimum": 0}


def _obj(properties: dict, required: list[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required or properties),
        "additionalProperties": False,
    }


_CHECKPOINT_ITEM = _obj(
    {
        "snapshot_id": _ID,
        "session": {"type": "string", "description": "The session that owns it."},
        "label": _NULLABLE_STR,
        "pinned": {"type": "boolean"},
        "tokens": {**_INT, "description": "Tokens in the state."},
        "n_messages": {**_INT, "description": "Transcript messages the state has consumed."},
        "bytes": _INT,
        "created": {"type": "number", "description": "Unix time."},
        "tier": {**_NULLABLE_STR, "description": "Hottest tier holding it: vram, ram or disk."},
        "is_head": {"type": "boolean", "description": "The session continues from this one."},
        "in_history": {"type": "boolean", "description": "The session's current head descends from it."},
    }
)

_SAMPLING = copy.deepcopy(SAMPLING_OPTIONS)  # defined once, with their bounds: engine/sampling_params.py


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # JSON Schema of the arguments (an object)
    returns: dict  # JSON Schema of the result (an object)
    mutates: bool  # changes state: runs on the daemon's worker, in turn with generation
    context: str | None = "session"  # the argument a conversation transport may fill in
    model_callable: bool = True  # offered to the model in chat `tools` (chat itself is not)

    def input_schema(self, contextual: bool = False) -> dict:
        """The argument schema; `contextual`: the context argument is optional (a connection's session)."""
        schema = copy.deepcopy(self.parameters)
        if contextual and self.context and self.context in schema.get("required", ()):
            schema["required"] = [r for r in schema["required"] if r != self.context]
            prop = schema["properties"][self.context]
            prop["description"] = prop.get("description", "") + " Defaults to this conversation's session."
        return schema

    def openai(self, contextual: bool = False) -> dict:
        """The OpenAI function-calling tool object."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.input_schema(contextual),
            },
        }


TOOLS: dict[str, Tool] = {}


def _add(tool: Tool) -> None:
    TOOLS[tool.name] = tool


_add(
    Tool(
        name="checkpoint",
        description=(
            "Save the session's current state as a checkpoint (pinned, never evicted) under an optional "
            "label, before a risky step. Returns the checkpoint's snapshot id; restore or branch from it "
            "later by id or label."
        ),
        parameters=_obj(
            {
                "session": _session("The session to checkpoint."),
                "label": {**_REF, "description": f"A name for the checkpoint (at most {MAX_LABEL_CHARS} characters)."},
            },
            required=["session"],
        ),
        returns=_obj(
            {
                "snapshot_id": _ID,
                "session": {"type": "string"},
                "label": _NULLABLE_STR,
                "pinned": {"type": "boolean"},
                "tokens": _INT,
                "n_messages": _INT,
                "created": {"type": "number"},
            }
        ),
        mutates=True,
    )
)

_add(
    Tool(
        name="branch",
        description=(
            "Fork a new session to explore an alternative without touching the original: from a session's "
            "current state, from one of its checkpoints (give `checkpoint`: a label or snapshot id), from a "
            "snapshot id, or from a label. Nothing is copied; the new session shares the history up to there."
        ),
        parameters=_obj(
            {
                "source": {
                    **_REF,
                    "description": "A session name, a snapshot id (or unique prefix), or a checkpoint label.",
                },
                "new_session": _session("Name of the new session (must not exist yet)."),
                "checkpoint": {
                    **_REF,
                    "description": "With a session as source: branch from this checkpoint of it "
                    "(label or snapshot id) instead of its current state.",
                },
            },
            required=["source", "new_session"],
        ),
        returns=_obj(
            {
                "session": {"type": "string", "description": "The new session."},
                "source_session": _NULLABLE_STR,
                "snapshot_id": {**_NULLABLE_STR, "description": "The state it starts from (null: none yet)."},
                "tokens": _INT,
                "n_messages": _INT,
            }
        ),
        mutates=True,
        context="source",
    )
)

_add(
    Tool(
        name="restore",
        description=(
            "Move the session back to an earlier checkpoint of its own history (label or snapshot id): the "
            "next turn continues exactly from there and the transcript is rewound to that point. Later "
            "snapshots stay listed, so you can restore forward again. A checkpoint of a branch made from "
            "this session works too: the session adopts that branch's state and transcript."
        ),
        parameters=_obj(
            {
                "session": _session("The session to restore."),
                "checkpoint": {
                    **_REF,
                    "description": "Label or snapshot id (or unique prefix) of a checkpoint in its "
                    "history, or of a branch made from it.",
                },
            }
        ),
        returns=_obj(
            {
                "session": {"type": "string"},
                "snapshot_id": _ID,
                "label": _NULLABLE_STR,
                "previous_head": _NULLABLE_STR,
                "tokens": _INT,
                "n_messages": _INT,
                "tier": {**_NULLABLE_STR, "description": "Where the state was loaded from: live, vram, ram or disk."},
                "restore_ms": _NULLABLE_NUM,
            }
        ),
        mutates=True,
    )
)

_add(
    Tool(
        name="list_checkpoints",
        description=(
            "List the session's checkpoints, oldest first: its own and those its history descends from "
            "(a branch sees its source's earlier checkpoints). include_turns adds every turn's snapshot."
        ),
        parameters=_obj(
            {
                "session": _session("The session."),
                "include_turns": {
                    "type": "boolean",
                    "description": "Also list unpinned per-turn snapshots. Default false.",
                },
            },
            required=["session"],
        ),
        returns=_obj(
            {
                "session": {"type": "string"},
                "head": _NULLABLE_STR,
                "checkpoints": {"type": "array", "items": _CHECKPOINT_ITEM},
            }
        ),
        mutates=False,
    )
)

_add(
    Tool(
        name="delete_checkpoint",
        description=(
            "Delete a checkpoint by snapshot id (or unique prefix). It stops being a checkpoint at once; its "
            "data is deleted too unless a session still continues or branches from it (then `deleted` is "
            "false and `reason` says which)."
        ),
        parameters=_obj(
            {
                "id": {
                    "type": "string",
                    "minLength": MIN_ID_PREFIX,
                    "maxLength": 32,
                    "pattern": f"^[0-9a-f]{{{MIN_ID_PREFIX},32}}$",
                    "description": f"Snapshot id of the checkpoint, or a unique prefix of {MIN_ID_PREFIX}+ hex digits.",
                },
            }
        ),
        returns=_obj(
            {
                "snapshot_id": _ID,
                "session": {"type": "string"},
                "deleted": {"type": "boolean", "description": "The snapshot's data was deleted."},
                "reason": {**_NULLABLE_STR, "description": "Why the data was kept."},
            }
        ),
        mutates=True,
        context=None,
    )
)

_add(
    Tool(
        name="session_info",
        description=(
            "How big the session's state is and where it lives: tokens in the state, snapshot bytes, tier, "
            "head snapshot, transcript length, checkpoints."
        ),
        parameters=_obj({"session": _session("The session.")}),
        returns=_obj(
            {
                "session": {"type": "string"},
                "head": {**_NULLABLE_STR, "description": "Snapshot id the next turn continues from."},
                "tokens": {**_INT, "description": "Tokens in the head state."},
                "snapshot_bytes": {**_INT, "description": "Bytes of the head snapshot."},
                "stored_bytes": {**_INT, "description": "Bytes of all snapshots the session owns."},
                "tier": {**_NULLABLE_STR, "description": "Hottest tier holding the head: vram, ram or disk."},
                "hot": {"type": "boolean", "description": "The head state is loaded in the model, ready to continue."},
                "n_messages": _INT,
                "n_snapshots": _INT,
                "n_checkpoints": _INT,
                "base": {**_NULLABLE_STR, "description": "The snapshot it was branched from, if a branch."},
                "model_id": _NULLABLE_STR,
                "created": {"type": "number"},
                "last_used": {"type": "number"},
            }
        ),
        mutates=False,
    )
)

_add(
    Tool(
        name="chat",
        description=(
            "Send a user message to the session and get the model's reply. The state is snapshotted after "
            "the turn; the next turn continues from it without re-reading the conversation."
        ),
        parameters=_obj(
            {
                "session": _session("The session (created on first use)."),
                "message": {"type": "string", "minLength": 1, "description": "The user message."},
                **_SAMPLING,
            },
            required=["session", "message"],
        ),
        returns=_obj(
            {
                "session": {"type": "string"},
                "reply": {"type": "string"},
                "finish_reason": {"type": "string", "enum": ["stop", "length", "cancelled"]},
                "snapshot_id": _NULLABLE_STR,
                "usage": _obj(
                    {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT, "cached_tokens": _INT}
                ),
                "resumed": {"type": "boolean"},
                "restored_tokens": _INT,
                "tier": _NULLABLE_STR,
                "restore_ms": _NULLABLE_NUM,
            }
        ),
        mutates=True,
        model_callable=False,
    )
)

STATE_TOOLS = tuple(n for n, t in TOOLS.items() if t.model_callable)  # what a model may call


def get_tool(name: object) -> Tool:
    if not isinstance(name, str) or name not in TOOLS:
        shown = name if isinstance(name, str) else type(name).__name__
        raise UnknownTool(
            f"no tool named {str(shown)[:60]!r}; the tools are: {', '.join(TOOLS)}.",
            hint="GET /v1/agent/tools lists them with their schemas",
        )
    return TOOLS[name]


def openai_tools(include_chat: bool = False, contextual: bool = False) -> list[dict]:
    return [t.openai(contextual) for t in TOOLS.values() if t.model_callable or include_chat]


def result_schemas(include_chat: bool = False) -> dict[str, dict]:
    return {t.name: t.returns for t in TOOLS.values() if t.model_callable or include_chat}


# -- validation --------------------------------------------------------------------------------------------
_TYPES = {"string": str, "boolean": bool, "object": dict, "array": list}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", dict: "object", list: "array"}.get(type(value), type(value).__name__)


def _is(value: Any, t: str) -> bool:
    if t == "null":
        return value is None
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[t])


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check(schema: Mapping[str, Any], value: Any, where: str) -> None:
    """Validate `value` against the JSON Schema subset the tools use; ToolArgumentError names `where`."""
    types = schema.get("type")
    if types is not None:
        allowed = [types] if isinstance(types, str) else list(types)
        if not any(_is(value, t) for t in allowed):
            want = " or ".join(
                "an integer" if t == "integer" else f"a {t}" if t != "object" else "an object" for t in allowed
            )
            raise ToolArgumentError(f"{where}: must be {want} (got {_type_name(value)} {_shown(value)}).", where)
    if "enum" in schema and value not in schema["enum"]:
        raise ToolArgumentError(
            f"{where}: must be one of {', '.join(map(str, schema['enum']))} (got {_shown(value)}).", where
        )
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            raise ToolArgumentError(
                f"{where}: must not be empty."
                if schema["minLength"] == 1
                else f"{where}: must be at least {schema['minLength']} characters.",
                where,
            )
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise ToolArgumentError(f"{where}: must be at most {schema['maxLength']} characters.", where)
        if "pattern" in schema and not re.search(schema["pattern"], value):
            raise ToolArgumentError(f"{where}: {_shown(value)} does not match {schema['pattern']}.", where)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise ToolArgumentError(f"{where}: must be at least {schema['minimum']} (got {value}).", where)
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            raise ToolArgumentError(f"{where}: must be greater than {schema['exclusiveMinimum']} (got {value}).", where)
        if "maximum" in schema and value > schema["maximum"]:
            raise ToolArgumentError(f"{where}: must be at most {schema['maximum']} (got {value}).", where)
    elif isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise ToolArgumentError(f"{where}: at most {schema['maxItems']} items.", where)
        for i, item in enumerate(value):
            check(schema.get("items", {}), item, f"{where}[{i}]")
    elif isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value or value[key] is None and "null" not in _types(props.get(key, {})):
                raise ToolArgumentError(f"{_join(where, key)}: is required.", _join(where, key))
        for key, item in value.items():
            if key not in props:
                if schema.get("additionalProperties", True) is False:
                    raise ToolArgumentError(
                        f"{_join(where, str(key))}: unknown argument; the arguments are {', '.join(props) or 'none'}.",
                        _join(where, str(key)),
                    )
                continue
            if item is None and key not in schema.get("required", ()) and "null" not in _types(props[key]):
                continue  # an optional argument given as null = left out
            check(props[key], item, _join(where, key))


def _types(schema: Mapping[str, Any]) -> list[str]:
    t = schema.get("type")
    return [t] if isinstance(t, str) else list(t or ())


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


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
        raise ToolArgumentError(f"arguments: must be a JSON object (got {_type_name(arguments)}).", "arguments")
    args = dict(arguments)
    if session is not None and tool.context and args.get(tool.context) is None:
        args[tool.context] = session
    for key, validator in _NAME_FIELDS.items():
        if key in tool.parameters["properties"] and isinstance(args.get(key), str):
            try:
                validator(args[key])
            except InvalidName as e:
                raise ToolArgumentError(f"{key}: {e.message}", key, e.hint) from None
    check(tool.parameters, args, "")
    return {k: v for k, v in args.items() if v is not None}


def error_json(exc: BaseException) -> dict[str, Any]:
    """A tool failure as the agent transports show it: {message, code, param?, hint?}."""
    from engramctl.errors import EngramError

    if isinstance(exc, EngramError):
        out: dict[str, Any] = {"message": exc.message, "code": exc.kind}
        param = getattr(exc, "param", None)
        if param:
            out["param"] = param
        if exc.hint:
            out["hint"] = exc.hint
        return out
    return {"message": f"internal error: {type(exc).__name__}: {exc}", "code": "internal_error"}
