"""Request bodies (pydantic) and the JSON the daemon answers with.

Requests follow OpenAI's chat completion schema plus extensions: `session` (continue that session
with the daemon's own state; `conversation_id`, the original Engram server's name, says the same) and
the sampling options OpenAI lacks (top_k, min_p, repeat_penalty: engine/sampling_params.py defines them
all, OpenAI's presence/frequency penalties and logit_bias included). Unknown OpenAI fields (user, ...)
are accepted and ignored, as other local servers do; fields that would change the answer in a way we
cannot honour (n > 1) are refused with a 400. `logprobs: true` (with `top_logprobs`, 0 to 20) answers each
reply token's logprob in OpenAI's shape (logprobs_json.py). `tools` go to routes_agent.chat_with_tools;
`response_format` (structured output) is daemon/response_format.py's.
/v1/completions' body is in completion_schemas.py, Ollama's in ollama_schemas.py.

The snapshot routes also take the Engram server's own fields (turn_number, branch_name, a custom
snapshot_id, create_new_request, continuation_ids, max_new_tokens, rid, request_id); what they mean is
in docs/engram-api.md.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from engramctl.daemon.response_format import ResponseFormat, constrained
from engramctl.engine.sampling_params import MAX_LOGIT_BIAS, MAX_STOP, MAX_TOP_LOGPROBS, OPTIONS, SamplingParams
from engramctl.errors import UsageError
from engramctl.store.names import is_snapshot_id, named_session, validate_engram_api_name, validate_session_name

ROLES = ("system", "developer", "user", "assistant", "tool")


# What /openapi.json says a name or id looks like. Documentation only (json_schema_extra): the checks
# themselves are store.names' validators, whose messages say which rule a value broke.
_SESSION_DOC = {"pattern": "^[A-Za-z0-9._-]{1,64}$"}
_ENGRAM_NAME_DOC = {"pattern": "^[A-Za-z0-9._-]{1,255}$"}
_SNAPSHOT_REF_DOC = {
    "pattern": "^[A-Za-z0-9._-]{1,255}$",
    "description": "A snapshot id (32 hex digits), a unique prefix of one (4+ hex digits), or a name a save gave it.",
}
_LABEL_DOC = {"pattern": "^[^\\x00-\\x1f\\x7f]{1,128}$"}


def text_only(v: str) -> str:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:  # JSON may escape half a UTF-16 pair ("\ud800"); no tokenizer takes that
        raise ValueError("contains a lone UTF-16 surrogate, which is not text") from None
    return v


# Text the model reads: a string that is valid Unicode text (every field a tokenizer encodes is one)
Text = Annotated[str, AfterValidator(text_only)]


def _doc(default: Any, extra: dict) -> Any:
    return Field(default, json_schema_extra=extra)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: Text | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ... are accepted and not used
    role: str = Field(json_schema_extra={"enum": list(ROLES)})
    content: str | list[TextPart] | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, v):
        return text_only(v) if isinstance(v, str) else v

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


def sampling_field(schema: dict) -> tuple[Any, Any]:
    """One sampling option as a request field (optional: null or absent means the default), typed and
    bounded by its JSON Schema in engine/sampling_params.py."""
    if schema["type"] == ["string", "array"]:
        return str | list[str] | None, Field(None, description=schema["description"])  # length: _stop below
    if schema["type"] == "object":  # logit_bias: token id (a JSON object's keys are strings) -> bias
        key = Annotated[str, Field(pattern=schema["propertyNames"]["pattern"])]
        value = Annotated[float, Field(**_bounds(schema["additionalProperties"]))]
        documented = WithJsonSchema({k: v for k, v in schema.items() if k != "description"})  # keys and values
        return Annotated[dict[key, value], documented] | None, Field(None, description=schema["description"])
    kind = {"number": float, "integer": int}[schema["type"]]
    return kind | None, Field(None, description=schema["description"], **_bounds(schema))


def _bounds(schema: dict) -> dict:
    # NaN and infinities are refused (Python's JSON parser reads NaN and Infinity; pydantic would pass them on)
    nan = {"allow_inf_nan": False} if schema["type"] == "number" else {}
    return {"ge": schema.get("minimum"), "gt": schema.get("exclusiveMinimum"), "le": schema.get("maximum"), **nan}


def check_stops(v):
    """`stop`, in either dialect: one string or at most MAX_STOP of them."""
    if isinstance(v, list) and len(v) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop strings")
    return v


class _SamplingRules(BaseModel):
    @field_validator("stop", check_fields=False)
    @classmethod
    def _stop(cls, v):
        return check_stops(v)

    @field_validator("logit_bias", check_fields=False)
    @classmethod
    def _logit_bias(cls, v):
        if v is not None and len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} entries")
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
    "Sampling",
    __base__=_SamplingRules,
    **{name: sampling_field(schema) for name, schema in OPTIONS.items()},
    max_completion_tokens=sampling_field(OPTIONS["max_tokens"]),
)


class ChatCompletionRequest(Sampling):
    model_config = ConfigDict(extra="ignore")
    model: str = "default"
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    session: str | None = _doc(None, _SESSION_DOC)
    conversation_id: str | None = _doc(None, _ENGRAM_NAME_DOC)  # the original Engram server's name for `session`
    rid: str | None = _doc(None, _ENGRAM_NAME_DOC)  # its clients' request id, their conversation key without one
    tools: list[Any] | None = None
    tool_choice: Any = None  # "auto" (None), "none", "required" or a function: routes_agent.chat_with_tools
    logprobs: bool | None = Field(None, description="Answer each reply token's logprob (choices[].logprobs).")
    top_logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="With logprobs: this many most likely tokens at each position, with their logprobs.",
    )
    response_format: ResponseFormat | None = None  # structured output: daemon/response_format.py

    @model_validator(mode="after")
    def _supported(self):
        if self.n != 1:
            raise ValueError("only n=1 is supported")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs: true")
        if self.logprobs and self.tools:
            raise ValueError("logprobs: not supported with tools")
        if self.tools and self.response_format is not None and self.response_format.type != "text":
            raise ValueError("response_format: a JSON reply cannot be combined with tools on this server")
        named_session(self.session, self.conversation_id, self.rid)
        return self

    def params(self) -> SamplingParams:
        """The sampling options, with the logprob record the request asks for and response_format's grammar,
        checked (UnsupportedSchema: a 400)."""
        wanted = (self.top_logprobs or 0) if self.logprobs else None
        fmt = self.response_format
        params = dataclasses.replace(super().params(), logprobs=wanted)
        return constrained(params, lambda: fmt.spec() if fmt else None, "response_format")

    @property
    def session_name(self) -> str | None:
        return named_session(self.session, self.conversation_id, self.rid)


class SessionRef(BaseModel):
    """`session` and `conversation_id` name the same thing (the original Engram API used the latter, and
    its `rid` where no conversation_id is given)."""

    model_config = ConfigDict(extra="ignore")
    session: str | None = _doc(None, _SESSION_DOC)
    conversation_id: str | None = _doc(None, _ENGRAM_NAME_DOC)
    rid: str | None = _doc(
        None, _ENGRAM_NAME_DOC
    )  # the Engram server's request id: here only its fallback use as the conversation key

    @model_validator(mode="after")
    def _one_name(self):
        named_session(self.session, self.conversation_id, self.rid)
        return self

    @property
    def conversation_key(self) -> str | None:
        """The conversation as the Engram server reads it: conversation_id, else rid."""
        return self.conversation_id if self.conversation_id is not None else self.rid

    @property
    def session_name(self) -> str | None:
        return named_session(self.session, self.conversation_id, self.rid)

    @property
    def conversation(self) -> str | None:
        """The conversation's name as the request gave it (what the answers call conversation_id)."""
        return self.session if self.session is not None else self.conversation_key

    def given(self, *names: str) -> bool:
        """Whether the request carries any of these fields, even as an explicit null (the Engram server's
        Python client sends every field it knows, null when unset)."""
        return bool(self.model_fields_set & set(names))


# The Engram server's own fields: a request that carries one is answered in its terms (docs/engram-api.md).
ENGRAM_FIELDS = (
    "turn_number",
    "branch_name",
    "rid",
    "create_new_request",
    "continuation_ids",
    "max_new_tokens",
    "request_id",
)
_TURN = Field(None, ge=0, description="The Engram server's turn selector: turn 1 is the state after the first reply.")
_BRANCH = Field(
    None, description="The Engram server's branch selector (its own session here).", json_schema_extra=_ENGRAM_NAME_DOC
)


class _Selectors(SessionRef):
    """The Engram server's snapshot selectors within a conversation: turn_number, branch_name."""

    turn_number: int | None = _TURN
    branch_name: str | None = _BRANCH

    @field_validator("branch_name")
    @classmethod
    def _branch(cls, v: str | None) -> str | None:
        return None if v is None else validate_engram_api_name(v, "branch_name")

    @property
    def selects(self) -> bool:
        return self.turn_number is not None or self.branch_name is not None

    def check_selectors(self, snapshot_id: str | None) -> None:
        if self.selects and self.session_name is None:
            raise ValueError(
                "turn_number and branch_name select a snapshot of a conversation: give its conversation_id"
            )
        if self.selects and snapshot_id is not None:
            raise ValueError("give a snapshot_id, or a conversation_id with turn_number or branch_name, not both")


class SaveSnapshotRequest(_Selectors):
    label: str | None = _doc(None, _LABEL_DOC)
    pin: bool = True
    snapshot_id: str | None = _doc(
        None, _ENGRAM_NAME_DOC
    )  # the Engram server's custom id: the name the snapshot is saved under

    @field_validator("snapshot_id")
    @classmethod
    def _custom_id(cls, v: str | None) -> str | None:
        if v is not None and is_snapshot_id(validate_engram_api_name(v, "snapshot_id")):
            raise ValueError("a custom snapshot_id cannot look like a snapshot's own id (32 hex digits)")
        return v

    @property
    def engram(self) -> bool:
        """Answered in the Engram server's terms: it uses one of its fields, or names the conversation only
        by conversation_id (none of ours: session, label, pin)."""
        return self.given("snapshot_id", *ENGRAM_FIELDS) or (
            self.given("conversation_id") and not self.given("session", "label", "pin")
        )


class RestoreSnapshotRequest(_Selectors, Sampling):
    snapshot_id: str | None = _doc(None, _SNAPSHOT_REF_DOC)
    continuation: str | ChatMessage | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    model: str = "default"
    # the Engram server's restore-and-generate
    create_new_request: bool | None = None
    continuation_ids: list[Annotated[int, Field(ge=0)]] | None = None
    max_new_tokens: int | None = Field(None, ge=1)
    request_id: str | None = None

    @model_validator(mode="after")
    def _target(self):
        if self.snapshot_id is None and self.session_name is None:
            raise ValueError("give a snapshot_id, or a session (conversation_id) to restore its head")
        self.check_selectors(self.snapshot_id)
        if self.continuation is not None and self.continuation_ids is not None:
            raise ValueError("give continuation (a message) or continuation_ids (token ids), not both")
        if self.create_new_request is False and (self.continuation_ids is not None or self.max_new_tokens is not None):
            raise ValueError("continuation_ids and max_new_tokens can only be provided when create_new_request=true")
        if self.max_new_tokens is not None and self.continuation_ids is None and not self.create_new_request:
            raise ValueError("max_new_tokens goes with continuation_ids (restore-and-generate)")
        if self.continuation_ids is not None and self.stream:
            raise ValueError("a restore-and-generate with continuation_ids answers once; stream is not supported")
        mine = {self.max_tokens, self.max_completion_tokens} - {None}  # type: ignore[attr-defined]
        if self.max_new_tokens is not None and mine - {self.max_new_tokens}:
            raise ValueError("max_new_tokens and max_tokens say different things; give one")
        return self

    def continuation_message(self) -> dict[str, str] | None:
        if self.continuation is None:
            return None
        if isinstance(self.continuation, str):
            return {"role": "user", "content": self.continuation}
        return self.continuation.plain()

    def token_params(self) -> SamplingParams:
        """Sampling for a restore-and-generate with continuation_ids: as asked, else greedy (temperature 0,
        reproducible); max_new_tokens is max_tokens."""
        options = {name: getattr(self, name) for name in OPTIONS}
        if options["temperature"] is None:
            options["temperature"] = 0.0
        mine = self.max_tokens or self.max_completion_tokens  # type: ignore[attr-defined]
        options["max_tokens"] = self.max_new_tokens or mine
        return SamplingParams.from_options(options)


class ListSnapshotsRequest(SessionRef):
    @property
    def engram(self) -> bool:
        """Listed in the Engram server's terms (its order, an empty list for an unknown conversation): the
        conversation is named by conversation_id (or rid), not by our `session`."""
        return self.session is None and self.conversation_key is not None


class SnapshotInfoRequest(_Selectors):
    snapshot_id: str | None = _doc(None, _SNAPSHOT_REF_DOC)

    @model_validator(mode="after")
    def _target(self):
        if self.snapshot_id is None and self.session_name is None:
            raise ValueError("give a snapshot_id, or a session (conversation_id) for its head")
        self.check_selectors(self.snapshot_id)
        return self


class DeleteSnapshotRequest(_Selectors):
    snapshot_id: str | None = _doc(None, _SNAPSHOT_REF_DOC)
    force: bool | None = None  # default: false for a snapshot_id, true for the Engram selectors (their delete)

    @model_validator(mode="after")
    def _target(self):
        if self.snapshot_id is None and not (self.selects and self.session_name is not None):
            raise ValueError("give a snapshot_id, or a conversation_id with its turn_number or branch_name")
        self.check_selectors(self.snapshot_id)
        return self


class SnapshotRef(BaseModel):
    """One snapshot by id or unique id prefix (/unpin_snapshot, /get_snapshot_transcript)."""

    model_config = ConfigDict(extra="ignore")
    snapshot_id: str = Field(json_schema_extra=_SNAPSHOT_REF_DOC)


class PinSnapshotRequest(SnapshotRef):
    label: str | None = _doc(None, _LABEL_DOC)  # also set this label


class LabelSnapshotRequest(SnapshotRef):
    label: str | None = Field(..., json_schema_extra=_LABEL_DOC)  # null clears it


class BranchSnapshotRequest(SessionRef):
    snapshot_id: str | None = _doc(None, _SNAPSHOT_REF_DOC)
    source: str | None = _doc(None, _ENGRAM_NAME_DOC)  # a session name or snapshot id
    new_session: str = Field(json_schema_extra=_SESSION_DOC)

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


# protocol.ErrorBody on the wire, as /openapi.json documents it for every failure (the Engram routes add
# their `success: false` and `message`: engram_api/answers.failure).
ERROR_BODY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code", "param"],
            "properties": {
                "message": {"type": "string", "description": "What is wrong, as a sentence."},
                "type": {"type": "string", "description": "OpenAI's coarse class (invalid_request_error, ...)."},
                "code": {"type": ["string", "null"], "description": "The precise reason (EngramError.kind)."},
                "param": {"type": ["string", "null"], "description": "The request field at fault, if one is."},
                "hint": {"type": "string", "description": "The next thing to try, when there is one."},
            },
        },
        "success": {"type": "boolean", "const": False, "description": "Engram snapshot routes only."},
        "message": {"type": "string", "description": "Engram snapshot routes only: error.message again."},
    },
}
