"""Request bodies (pydantic) and the JSON the daemon answers with.

Requests follow OpenAI's chat completion schema plus two extensions: `session` (continue that
session with the daemon's own state) and `top_k`. Unknown OpenAI fields (user, penalties, ...) are
accepted and ignored, as other local servers do; fields that would change the answer in a way we
cannot honour (n > 1, logprobs) are refused with a 400. `tools` go to routes_agent.chat_with_tools.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from engramctl.engine.sampling_params import MAX_STOP, OPTIONS, SamplingParams
from engramctl.errors import UsageError
from engramctl.store.names import validate_session_name

ROLES = ("system", "developer", "user", "assistant", "tool")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ... are accepted and not used
    role: str
    content: str | list[TextPart] | None = None

    @field_validator("role")
    @classmethod
    def _role(cls, v: str) -> str:
        if v not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)} (got {v[:40]!r})")
        return v

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        out = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise UsageError(f"only text content is supported, not {part.type[:40]!r} parts.")
            out.append(part.text)
        return "".join(out)

    def plain(self) -> dict[str, str]:
        """The message as the chat template and the transcript see it."""
        return {"role": self.role, "content": self.text()}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


def _sampling_field(schema: dict) -> tuple[Any, Any]:
    """One sampling option as a request field (optional: null or absent means the default), typed and
    bounded by its JSON Schema in engine/sampling_params.py."""
    if schema["type"] == ["string", "array"]:
        return str | list[str] | None, Field(None, description=schema["description"])  # length: _stop below
    kind = {"number": float, "integer": int}[schema["type"]]
    bounds = {"ge": schema.get("minimum"), "gt": schema.get("exclusiveMinimum"), "le": schema.get("maximum")}
    return kind | None, Field(None, description=schema["description"], **bounds)


class _SamplingRules(BaseModel):
    @field_validator("stop", check_fields=False)
    @classmethod
    def _stop(cls, v):
        if isinstance(v, list) and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        return v

    def params(self) -> SamplingParams:
        """The engine's sampling parameters; max_tokens None = what the context has room for."""
        options = {name: getattr(self, name) for name in OPTIONS}
        if self.max_completion_tokens is not None:  # type: ignore[attr-defined]
            options["max_tokens"] = self.max_completion_tokens  # type: ignore[attr-defined]
        return SamplingParams.from_options(options)


# The sampling fields shared by chat completions, restore-with-continuation and the agent's WebSocket
# chat: every option SamplingParams defines, plus OpenAI's newer name for max_tokens.
Sampling = create_model(
    "Sampling", __base__=_SamplingRules,
    **{name: _sampling_field(schema) for name, schema in OPTIONS.items()},
    max_completion_tokens=_sampling_field(OPTIONS["max_tokens"]),
)  # fmt: skip


def _session_field(v: str | None) -> str | None:
    return None if v is None else validate_session_name(v)


class ChatCompletionRequest(Sampling):
    model_config = ConfigDict(extra="ignore")
    model: str = "default"
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    session: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None  # "auto" (None), "none", "required" or a function: routes_agent.chat_with_tools
    logprobs: bool | None = None

    @model_validator(mode="after")
    def _supported(self):
        if self.n != 1:
            raise ValueError("only n=1 is supported")
        if self.logprobs:
            raise ValueError("logprobs are not supported by this server")
        _session_field(self.session)
        return self


class SessionRef(BaseModel):
    """`session` and `conversation_id` name the same thing (the original Engram API used the latter)."""

    model_config = ConfigDict(extra="ignore")
    session: str | None = None
    conversation_id: str | None = None

    @model_validator(mode="after")
    def _one_name(self):
        if self.session is not None and self.conversation_id is not None and self.session != self.conversation_id:
            raise ValueError("session and conversation_id name the same thing; give one")
        _session_field(self.session_name)
        return self

    @property
    def session_name(self) -> str | None:
        return self.session if self.session is not None else self.conversation_id


class SaveSnapshotRequest(SessionRef):
    label: str | None = None
    pin: bool = True


class RestoreSnapshotRequest(SessionRef, Sampling):
    snapshot_id: str | None = None
    continuation: str | ChatMessage | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    model: str = "default"

    @model_validator(mode="after")
    def _target(self):
        if self.snapshot_id is None and self.session_name is None:
            raise ValueError("give a snapshot_id, or a session (conversation_id) to restore its head")
        return self

    def continuation_message(self) -> dict[str, str] | None:
        if self.continuation is None:
            return None
        if isinstance(self.continuation, str):
            return {"role": "user", "content": self.continuation}
        return self.continuation.plain()


class ListSnapshotsRequest(SessionRef):
    pass


class SnapshotInfoRequest(SessionRef):
    snapshot_id: str | None = None

    @model_validator(mode="after")
    def _target(self):
        if self.snapshot_id is None and self.session_name is None:
            raise ValueError("give a snapshot_id, or a session (conversation_id) for its head")
        return self


class DeleteSnapshotRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    snapshot_id: str
    force: bool = False


class SnapshotRef(BaseModel):
    """One snapshot by id or unique id prefix (/unpin_snapshot, /get_snapshot_transcript)."""

    model_config = ConfigDict(extra="ignore")
    snapshot_id: str


class PinSnapshotRequest(SnapshotRef):
    label: str | None = None  # also set this label


class LabelSnapshotRequest(SnapshotRef):
    label: str | None = Field(...)  # null clears it


class BranchSnapshotRequest(SessionRef):
    snapshot_id: str | None = None
    source: str | None = None  # a session name or snapshot id
    new_session: str

    @model_validator(mode="after")
    def _source(self):
        given = [x for x in (self.snapshot_id, self.source, self.session_name) if x is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of snapshot_id, source or session (conversation_id) to branch from")
        validate_session_name(self.new_session)
        return self

    @property
    def source_ref(self) -> str:
        return next(x for x in (self.snapshot_id, self.source, self.session_name) if x is not None)

