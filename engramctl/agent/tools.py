"""The agent tools, defined once: name, description, JSON Schema of the arguments and of the result.

Every transport serves these definitions and validates with arguments.py's `validate_arguments` before
anything runs:
    GET  /v1/agent/tools          OpenAI function-calling tool objects (Tool.openai())
    POST /v1/agent/call           {"tool": name, "arguments": {...}} -> {"tool": name, "result": {...}}
    WS   /v1/agent/ws             {"type": "call", "tool": name, "arguments": {...}} -> result | error
    MCP  engramctl mcp            tools/list (input and output schemas), tools/call
    chat `tools`                  the model's own calls, executed by the daemon

A conversation transport (a WebSocket connection, the MCP server, a chat turn) knows its session, so
there the `session` argument (`source` for branch) may be left out: Tool.context names that argument.

Arguments are checked against the schema by `jsonschema` (arguments.py over schema_check.py); bad ones
raise ToolArgumentError naming the field (`param`), before anything is touched.
No heavy imports here: the MCP server and the CLI import this module.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from engramctl.engine.sampling_params import OPTIONS as SAMPLING_OPTIONS
from engramctl.errors import UnknownTool
from engramctl.store.names import MAX_LABEL_CHARS, MIN_ID_PREFIX


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
                "stored_bytes": {
                    **_INT,
                    "description": "Bytes of its snapshots on disk, each KV block they share once.",
                },
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
