"""The sampling options, defined once: the engine's SamplingParams. Its fields' metadata (JSON Schema
bounds and one line of help) is what the daemon's request schemas, the agent tools' schemas, the
client's keyword list and the CLI's options are derived from, so a new option is one field here.

Torch-free on import: the CLI and the client import this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from engramctl.errors import UsageError

MAX_STOP = 16  # stop strings per request
MAX_TOP_LOGPROBS = 20  # top_logprobs per token (OpenAI's bound)
MAX_LOGIT_BIAS = 1024  # logit_bias entries per request (OpenAI documents none; a bound keeps a body's work small)
DEFAULT_MAX_TOKENS = 4096  # a reply's budget when max_tokens is not given: this, or what the context has left
# What `engramctl chat` sends when its user sets nothing: Ollama's defaults, because at OpenAI's
# temperature 1.0 with no cut-off small models ramble. The API keeps OpenAI's defaults (a client that
# leaves a field out expects them); --temperature 0 is greedy.
CHAT_DEFAULTS: dict[str, Any] = {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "repeat_penalty": 1.1}
# A `chat` one-shot's reply budget when its user sets none. A one-shot answers a question and exits; at the
# 4,096-token budget a 135M model that wanders (it does at temperature 0.8, about one first question in
# three) held a new user's first command for one to two minutes on a 2-core CPU. 512 tokens is several
# paragraphs, far past a simple answer (20-150 tokens), and at the 40-100 tokens/s such a model decodes on
# CPU it ends within seconds either way; --max-tokens lifts it. Interactive chat keeps the context's budget.
# (Being explicit, it is refused like any max_tokens once a session has less room left: the error says how much.)
ONE_SHOT_MAX_TOKENS = 512
REPEAT_WINDOW = 64  # tokens repeat_penalty looks back over (Ollama's repeat_last_n)


def _option(default: Any, schema: dict, help: str) -> Any:
    return field(default=default, metadata={"schema": {**schema, "description": help}})


@dataclass(frozen=True)
class SamplingParams:
    """How a reply is sampled. The defaults are OpenAI's: what a request that leaves a field out gets."""

    temperature: float = _option(
        1.0,
        {"type": "number", "minimum": 0, "maximum": 2},
        "Sampling temperature; 0 = greedy (deterministic).",
    )
    top_p: float = _option(
        1.0,
        {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "Nucleus sampling: only the most likely tokens covering this probability.",
    )
    top_k: int = _option(0, {"type": "integer", "minimum": 0}, "Sample from the k most likely tokens; 0 = off.")
    repeat_penalty: float = _option(
        1.0,
        {"type": "number", "exclusiveMinimum": 0, "maximum": 2},
        f"Make the last {REPEAT_WINDOW} tokens less likely (llama.cpp's repeat_penalty); 1 = off.",
    )
    min_p: float = _option(
        0.0,
        {"type": "number", "minimum": 0, "maximum": 1},
        "Drop tokens less likely than this fraction of the most likely one; 0 = off.",
    )
    presence_penalty: float = _option(
        0.0,
        {"type": "number", "minimum": -2, "maximum": 2},
        f"Subtract this from the logit of every token among the last {REPEAT_WINDOW} (OpenAI's rule); 0 = off.",
    )
    frequency_penalty: float = _option(
        0.0,
        {"type": "number", "minimum": -2, "maximum": 2},
        f"Subtract this times a token's count among the last {REPEAT_WINDOW} from its logit; 0 = off.",
    )
    logit_bias: tuple[tuple[int, float], ...] = _option(
        (),
        {
            "type": "object",
            "propertyNames": {"pattern": "^[0-9]{1,9}$"},
            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
            "maxProperties": MAX_LOGIT_BIAS,
        },
        "Token id -> bias added to its logit, -100 to 100 (-100 bans the token, 100 all but forces it).",
    )
    seed: int | None = _option(None, {"type": "integer"}, "Sampling seed (reproducible replies).")
    max_tokens: int | None = _option(
        None,
        {"type": "integer", "minimum": 1},
        f"Longest reply, in tokens (default: what the context has room for, at most {DEFAULT_MAX_TOKENS}).",
    )
    stop: tuple[str, ...] = _option(
        (), {"type": ["string", "array"], "items": {"type": "string"}, "maxItems": MAX_STOP}, "Stop string(s)."
    )
    # Not a request option by this name: each API spells it its own way (chat's `logprobs: true` with
    # `top_logprobs`, completions' `logprobs: n`), so its route sets it and OPTIONS leaves it out.
    logprobs: int | None = field(
        default=None,
        metadata={
            "schema": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_TOP_LOGPROBS,
                "description": "Record each reply token's logprob and this many most likely alternatives.",
            },
            "request_option": False,
        },
    )

    # Structured output: engine/constraint.py's spec (a JSON Schema as compact JSON text, or "json_object"),
    # None = free text. Not a request option by this name (no schema metadata: not in OPTIONS): the routes
    # set it from response_format / Ollama's format, which they check first.
    grammar: str | None = None

    def __post_init__(self):
        for f in fields(self):
            if "schema" in f.metadata:
                _check(f.name, getattr(self, f.name), f.metadata["schema"])

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "SamplingParams":
        """From request options by name: absent or None gets the default, `stop` may be one string,
        names that are not sampling options are ignored."""
        given = {k: v for k, v in options.items() if k in OPTIONS and v is not None}
        if "stop" in given:
            stop = given["stop"]
            given["stop"] = tuple(s for s in ((stop,) if isinstance(stop, str) else stop) if s)
        if "logit_bias" in given:
            given["logit_bias"] = _bias_pairs(given["logit_bias"])
        return cls(**given)

    @property
    def penalizes(self) -> bool:
        """Whether the recent tokens change the logits (repeat, presence or frequency penalty)."""
        return self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def generator(self):
        """A numpy random Generator seeded with `seed` (or from the OS's entropy)."""
        import numpy as np  # lazy: the CLI imports this module and need not pay for numpy

        # any integer is a seed (OpenAI's are signed 64-bit, Ollama's too)
        return np.random.default_rng(None if self.seed is None else self.seed % 2**64)


def _bias_pairs(bias: Any) -> tuple[tuple[int, float], ...]:
    """logit_bias as a request gives it (a JSON object: token id as a string -> bias), as sorted pairs."""
    if isinstance(bias, Mapping):
        items = list(bias.items())
    else:
        items = list(bias)
    pairs = {}
    for key, value in items:
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise UsageError(f"logit_bias: {str(key)[:40]!r} is not a token id (a non-negative integer).") from None
        if token < 0:
            raise UsageError(f"logit_bias: {token} is not a token id (a non-negative integer).")
        pairs[token] = value
    return tuple(sorted(pairs.items()))


def _check(name: str, value: Any, schema: dict) -> None:
    if value is None:
        return
    if schema["type"] == "object":
        if len(value) > schema["maxProperties"]:
            raise UsageError(f"{name}: at most {schema['maxProperties']} entries (got {len(value)}).")
        for token, bias in value:
            _check(f"{name}[{token}]", bias, schema["additionalProperties"])
        return
    if schema["type"] in ("number", "integer") and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise UsageError(f"{name} must be a number (got {str(value)[:40]!r}).")
    if schema["type"] == "integer" and not isinstance(value, int):
        raise UsageError(f"{name} must be an integer (got {value}).")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{name} must be a finite number (got {value}).")
    if "minimum" in schema and value < schema["minimum"]:
        raise UsageError(f"{name} must be >= {schema['minimum']} (got {value}).")
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        raise UsageError(f"{name} must be > {schema['exclusiveMinimum']} (got {value}).")
    if "maximum" in schema and value > schema["maximum"]:
        raise UsageError(f"{name} must be <= {schema['maximum']} (got {value}).")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        raise UsageError(f"{name}: at most {schema['maxItems']} items (got {len(value)}).")


# JSON Schema of each option as a request carries it, by name, in declaration order.
OPTIONS: dict[str, dict] = {
    f.name: f.metadata["schema"]
    for f in fields(SamplingParams)
    if "schema" in f.metadata and f.metadata.get("request_option", True)
}
