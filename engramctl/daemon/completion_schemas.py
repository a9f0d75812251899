"""The request body of POST /v1/completions: OpenAI's legacy text completion, with the sampling options
every generating route shares (schemas.Sampling).

`prompt` is a string, token ids, or a list of one of either (OpenAI's batch form, with one prompt: a
batch of several is refused). `suffix` asks for fill-in-the-middle (engine/fim.py). `logprobs` (0 to 5, as
OpenAI's) answers each token's logprob and that many most likely alternatives (not with `echo`: the prompt's
tokens are not scored); `best_of` > 1 is refused with
a 400 naming it; `user` and other unknown fields are ignored. Without `max_tokens` (or `max_completion_tokens`)
a completion is at most 16 tokens, OpenAI's default for this API: a client written for it relies on that.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from engramctl.daemon.schemas import Sampling, StreamOptions, Text, text_only
from engramctl.engine.sampling_params import SamplingParams

TokenIds = list[Annotated[int, Field(ge=0)]]
MAX_LOGPROBS = 5  # OpenAI's bound on the legacy API's logprobs
DEFAULT_MAX_TOKENS = 16  # OpenAI's max_tokens for /v1/completions when the request leaves it out


class CompletionBody(Sampling):
    model_config = ConfigDict(extra="ignore")
    model: str = "default"
    prompt: str | list[str] | TokenIds | list[TokenIds] = Field(
        description="The text to complete: a string or token ids (or a list holding one of either)."
    )
    suffix: Text | None = Field(None, description="Text after the completion (models with fill-in-the-middle tokens).")
    echo: bool = Field(False, description="Start the answer's text with the prompt.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    best_of: int | None = None
    logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description="Answer each token's logprob and this many most likely tokens with theirs (choices[].logprobs).",
    )

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _prompt(cls, v, handler):
        """One sentence for a prompt of none of the four shapes (pydantic would list each shape's complaint)."""
        try:
            return handler(v)
        except ValidationError:
            ids = v[0] if isinstance(v, list) and len(v) == 1 and isinstance(v[0], list) else v
            if isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                bad = next(t for t in ids if t < 0)
                raise ValueError(f"token id {bad} is not a token id (ids are integers >= 0)") from None
            raise ValueError("must be a string, a list of token ids, or a list holding one of either") from None

    @model_validator(mode="after")
    def _supported(self):
        if self.n != 1:
            raise ValueError("n: only n=1 is supported")
        if self.best_of not in (None, 1):
            raise ValueError("best_of: only best_of=1 is supported")
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], (str, list)):
            if len(self.prompt) != 1:
                raise ValueError(f"prompt: one prompt per request (got a batch of {len(self.prompt)})")
        if isinstance(self.prompt_one(), str):
            try:
                text_only(self.prompt_one())  # type: ignore[arg-type]
            except ValueError as e:
                raise ValueError(f"prompt: {e}") from None
        return self

    def params(self) -> SamplingParams:
        """The sampling options, with the logprob record the request asks for and OpenAI's default length."""
        params = dataclasses.replace(super().params(), logprobs=self.logprobs)
        if self.max_tokens is None and self.max_completion_tokens is None:
            params = dataclasses.replace(params, max_tokens=DEFAULT_MAX_TOKENS)
        return params

    def prompt_one(self) -> str | list[int]:
        """The one prompt: its text, or its token ids."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            return p[0]  # type: ignore[return-value]
        return p  # type: ignore[return-value]
