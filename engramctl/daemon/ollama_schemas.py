"""Request bodies of Ollama's API (/api/chat, /api/generate, /api/show), as its api/types.go and the official
`ollama` Python client send them.

`options` takes Ollama's sampling options; those the engine has (engine/sampling_params.py) are typed and
bounded from their one definition there, num_predict is max_tokens (negative: as long as the context
allows), num_ctx and the runner's own options (num_gpu, num_thread, ...) are accepted and change nothing.
`format` ("json" or a JSON Schema) constrains the reply (daemon/response_format.py; a schema feature the grammar
cannot enforce is a 400 naming it). /api/chat's `tools` are Ollama's (OpenAI's function tools); the reply's
calls come back in `message.tool_calls` with arguments as an object, and `role: "tool"` messages (with
`tool_name`) carry the results back (daemon/tool_chat.py). Ollama has no `tool_choice`; this server takes one
(OpenAI's values) at the top level or, where a client can only pass `options` (the `ollama` package,
LangChain's ChatOllama), as options.tool_choice. What would change the answer in a way this server cannot
honour yet is refused with a 400 naming the field: `images`, `logprobs`, a `template` override. `keep_alive`
and `think` are accepted (the model stays loaded while the daemon runs; there is no thinking mode).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from engramctl.agent.calls import assistant_text
from engramctl.daemon.response_format import constrained, ollama_spec
from engramctl.daemon.schemas import Text, check_stops, sampling_field
from engramctl.engine.sampling_params import CHAT_DEFAULTS, OPTIONS, SamplingParams

# Ollama's options that are the engine's sampling options by the same name (not logit_bias: Ollama has none)
SHARED = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "seed")


class _OptionRules(BaseModel):
    model_config = ConfigDict(extra="ignore")  # typical_p, mirostat, num_gpu, ...: accepted, not used

    @field_validator("stop", check_fields=False)
    @classmethod
    def _stop(cls, v):
        return check_stops(v)

    def params(self) -> SamplingParams:
        """Ollama's defaults (CHAT_DEFAULTS) for what is not set, as an Ollama client expects."""
        options: dict[str, Any] = dict(CHAT_DEFAULTS)
        options.update({name: getattr(self, name) for name in (*SHARED, "stop") if getattr(self, name) is not None})
        n = self.num_predict  # type: ignore[attr-defined]
        options["max_tokens"] = n if n is not None and n > 0 else None  # -1, -2 (and 0): what the context allows
        return SamplingParams.from_options(options)


OllamaOptions = create_model(
    "OllamaOptions",
    __base__=_OptionRules,
    **{name: sampling_field(OPTIONS[name]) for name in (*SHARED, "stop")},
    num_predict=(int | None, Field(None, description="Longest reply in tokens; -1 or -2: what the context allows.")),
    num_ctx=(int | None, Field(None, ge=1, description="Accepted; the served model's own context is used.")),
    tool_choice=(Any, Field(None, description="With tools (this server's, not Ollama's): as OpenAI's tool_choice.")),
)

Format = Annotated[
    Any, Field(description='Structured output: "json" (any JSON object) or a JSON Schema the reply follows.')
]


class OllamaMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # thinking: accepted, not used
    role: str = Field(json_schema_extra={"enum": ["system", "user", "assistant", "tool"]})
    content: Text | None = None
    images: list[Any] | None = None
    tool_calls: list[Any] | None = None
    tool_name: str | None = None  # a tool message's: the function whose result it is (the template sees content)

    @field_validator("role")
    @classmethod
    def _role(cls, v: str) -> str:
        if v not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"role must be one of system, user, assistant, tool (got {v[:40]!r})")
        return v

    @model_validator(mode="after")
    def _text_only(self):
        if self.images:
            raise ValueError("images: this server serves text models only")
        return self

    def plain(self) -> dict[str, str]:
        """The message as the chat template sees it: an assistant's tool calls as the model wrote them."""
        if self.role == "assistant" and self.tool_calls:
            return {"role": self.role, "content": assistant_text(self.content or "", self.tool_calls)}
        return {"role": self.role, "content": self.content or ""}


class _Generating(BaseModel):
    """What /api/chat and /api/generate share."""

    model_config = ConfigDict(extra="ignore")
    model: str = "default"
    stream: bool = True  # Ollama streams unless told not to
    format: Format = None
    options: OllamaOptions | None = None  # type: ignore[valid-type]
    keep_alive: float | str | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    @model_validator(mode="after")
    def _supported(self):
        if self.logprobs or self.top_logprobs:
            raise ValueError("logprobs: not available on this server yet")
        return self

    def params(self) -> SamplingParams:
        """The options' sampling parameters with `format`'s grammar, checked (UnsupportedSchema: a 400)."""
        return constrained((self.options or OllamaOptions()).params(), lambda: ollama_spec(self.format), "format")

    @property
    def unload(self) -> bool:
        """keep_alive 0 with nothing to generate: Ollama's "unload the model" request (answered, not done)."""
        return self.keep_alive in (0, "0", "0s", "0m")


class OllamaChatRequest(_Generating):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[Any] | None = None
    tool_choice: Any = None  # this server's (Ollama has none): OpenAI's values; options.tool_choice says the same
    parallel_tool_calls: bool | None = None

    @property
    def choice(self) -> Any:
        """tool_choice, from the top level or the options."""
        if self.tool_choice is not None:
            return self.tool_choice
        return getattr(self.options, "tool_choice", None)


class OllamaGenerateRequest(_Generating):
    prompt: Text = ""
    suffix: Text | None = None
    system: Text | None = None
    template: str | None = None
    context: list[Annotated[int, Field(ge=0)]] | None = None
    raw: bool = False
    images: list[Any] | None = None

    @model_validator(mode="after")
    def _supported_generate(self):
        if self.images:
            raise ValueError("images: this server serves text models only")
        if self.template:
            raise ValueError("template: the model's own chat template is used; it cannot be replaced per request")
        return self


class OllamaShowRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    name: str | None = None  # what older clients call it
    verbose: bool | None = None

    @model_validator(mode="after")
    def _named(self):
        if not (self.model or self.name):
            raise ValueError("model: name the model to show")
        return self
