"""Request bodies (pydantic) and the JSON the daemon answers with.

Requests follow OpenAI's chat completion schema plus extensions: `session` (continue that session
with the daemon's own state; `conversation_id`, the original Engram server's name, says the same) and
the sampling options OpenAI lacks (top_k, min_p, repeat_penalty: engine/sampling_params.py defines them
all, OpenAI's presence/frequency penalties and logit_bias included). Unknown OpenAI fields (user, ...)
are accepted and ignored, as other local servers do; fields that would change the answer in a way we
cannot honour (n > 1) are refused with a 400. `logprobs: true` (with `top_logprobs`, 0 to 20) answers each
reply token's logprob in OpenAI's shape (logprobs_json.py). `tools`, `tool_choice` and `parallel_tool_calls` go
to tool_chat.chat_with_tools; `response_format` (structured output) is daemon/response_format.py's. A refusal
names its field first ("n: ..."), which errors.validation_problem makes the error's `param`.
/v1/completions' body is in completion_schemas.py, Ollama's in ollama_schemas.py.

The snapshot routes' bodies are in engram_api/schemas.py, over the parts defined here (ChatMessage,
Sampling, the name patterns /openapi.json documents).
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
from engramctl.errors import ContextOverflow, UsageError
from engramctl.store.names import named_session

ROLES = ("system", "developer", "user", "assistant", "tool")


# What /openapi.json says a name or id looks like. Documentation only (json_schema_extra): the checks
# themselves are store.names' validators, whose messages say which rule a value broke.
SESSION_DOC = {"pattern": "^[A-Za-z0-9._-]{1,64}$"}
ENGRAM_NAME_DOC = {"pattern": "^[A-Za-z0-9._-]{1,255}$"}
SNAPSHOT_REF_DOC = {
    "pattern": "^[A-Za-z0-9._-]{1,255}$",
    "description": "A snapshot id (32 hex digits), a unique prefix of one (4+ hex digits), or a name a save gave it.",
}
LABEL_DOC = {"pattern": "^[^\\x00-\\x1f\\x7f]{1,128}$"}


def text_only(v: str) -> str:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:  # JSON may escape half a UTF-16 pair ("\ud800"); no tokenizer takes that
        raise ValueError("contains a lone UTF-16 surrogate, which is not text") from None
    return v


# Text the model reads: a string that is valid Unicode text (every field a tokenizer encodes is one)
Text = Annotated[str, AfterValidator(text_only)]


def documented(default: Any, extra: dict) -> Any:
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

    def check_reply_room(self, context_length: int | None) -> None:
        """A reply budget the model's context cannot hold with any prompt, refused before anything runs and
        named as the request spelled it (the engine's own check, later, knows only max_tokens)."""
        for name in ("max_completion_tokens", "max_tokens"):
            n = getattr(self, name, None)
            if n is not None and context_length and n >= context_length:
                err = ContextOverflow(
                    f"{name}: {n} tokens do not fit the model's context of {context_length} tokens with a prompt.",
                    hint=f"ask for fewer than {context_length} tokens",
                )
                err.param = name
                raise err


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
    session: str | None = documented(None, SESSION_DOC)
    conversation_id: str | None = documented(None, ENGRAM_NAME_DOC)  # the original Engram server's name for `session`
    rid: str | None = documented(None, ENGRAM_NAME_DOC)  # its clients' request id, their conversation key without one
    tools: list[Any] | None = None
    # "auto" (None), "none", "required" or {"type": "function", "function": {"name": ...}}: tool_chat.py
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None  # false: one call at most (tool_grammar.py); absent or true: several
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
            raise ValueError(f"n: only n=1 is supported (got {self.n})")
        if not self.tools and self.tool_choice not in (None, "auto", "none"):
            raise ValueError("tool_choice: a tool call was asked for, but the request declares no tools")
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


class FreedBytesRequest(BaseModel):
    """POST /v1/snapshots/freed_bytes: the snapshots a deletion would take, by full id."""

    model_config = ConfigDict(extra="forbid")
    snapshot_ids: Annotated[list[Annotated[str, Field(min_length=1, max_length=128)]], Field(max_length=10_000)]
