"""Request bodies (pydantic) and the JSON the daemon answers with.

Requests follow OpenAI's chat completion schema plus two extensions: `session` (continue that
session with the daemon's own state) and `top_k`. Unknown OpenAI fields (user, penalties, ...) are
accepted and ignored, as other local servers do; fields that would change the answer in a way we
cannot honour (n > 1, logprobs) are refused with a 400. `tools` go to routes_agent.chat_with_tools.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engramctl.engine.sampling import SamplingParams
from engramctl.errors import UsageError
from engramctl.store.names import validate_session_name

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 16


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


class Sampling(BaseModel):
    """The sampling fields shared by chat completions and restore-with-continuation."""

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if isinstance(v, list) and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        return v

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,  # OpenAI's default
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
            max_tokens=max_tokens,
            stop=tuple(s for s in stop if s),
        )


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


FinishReason = Literal["stop", "length", "cancelled"]


def snapshot_json(rec) -> dict[str, Any]:
    """A SnapshotRecord as the snapshot routes show it."""
    return {
        "snapshot_id": rec.id,
        "session": rec.session,
        "conversation_id": rec.session,
        "parent": rec.parent,
        "tokens": rec.n_tokens,
        "bytes": rec.nbytes,
        "tier": rec.tiers[0] if rec.tiers else None,
        "tiers": list(rec.tiers),
        "created": rec.created,
        "last_access": rec.last_access,
        "pinned": rec.pinned,
        "label": rec.label,
        "durable": rec.durable,
        "n_messages": rec.n_messages,
        "model_id": rec.model_id,
        "fingerprint": rec.fingerprint,
        "checksum": rec.checksum,
    }


def session_json(info) -> dict[str, Any]:
    return {**info.to_json(), "conversation_id": info.name}
