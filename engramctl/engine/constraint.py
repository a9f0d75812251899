"""Structured output: a JSON Schema (or "any JSON object") as a grammar that masks the logits token by
token, so a reply that ends by itself always parses and validates. It is never retried or repaired.

    spec = grammar_spec(schema)            # the text SamplingParams.grammar carries (hashable)
    spec = lark_spec(grammar)              # or a Lark grammar (agent/tool_grammar.py: tool calls, %json inside)
    check(spec)                            # UnsupportedSchema (400) naming the feature, before generating
    c = Constraint(spec, tokenizer)        # one per reply (Sampler holds it)
    logits = c.mask(logits); ...; c.advance(token)

Why llguidance (scripts/bench_grammar.py measures it against xgrammar and outlines-core on SmolLM2's 49k
vocabulary and a 100k one; figures from the 2-core development machine under load, docs/structured-output.md):
- per-token cost (mask + advance): llguidance 21-48 us median, p95 0.1-2 ms, at 49k and 100k alike; it
  compiles nothing ahead per schema (1-2 ms a request). xgrammar's masks are cheaper once compiled
  (6-28 us median) but compiling a schema takes 0.45 s at 49k and 1.9 s at 100k, on every request with a
  new schema, and its p95 reached 54 ms at 100k; outlines-core compiles a full index per schema: 0.25-2.3 s,
  and 14-25 s for "any JSON object", with per-token medians up to 1 ms. A request would wait for those.
- coverage: llguidance implements the JSON Schema a structured-output request uses ($ref and recursion,
  anyOf/oneOf/allOf, enum/const, pattern, format, length, numeric and item bounds, prefixItems,
  additionalProperties, patternProperties, minProperties) and REFUSES what it cannot enforce (uniqueItems,
  not, if/then/else, propertyNames, dependentRequired ...), naming the keyword: exactly the 400 a client
  must get. outlines-core lacks allOf and not; xgrammar compiles not/if/uniqueItems schemas (without a
  word on what it enforces of them) and rejected a valid instance of {"type": "object"} in the bench.
- dependencies: llguidance is one wheel with none; xgrammar requires torch, transformers and triton.
- the tokenizer: built once per tokenizer (~0.2 s at 49k, ~0.6 s at 100k) and cached here; llama.cpp's
  vocabulary through llguidance's native llama.cpp hook, a transformers tokenizer through its
  tokenizer.json (both tokenize natively: llguidance calls the tokenizer while it masks).

JSON is generated compact (no free whitespace): a model that is unsure cannot spend its budget on
blanks. Where a reply is cut (max_tokens: finish_reason "length"; a stop string: "stop"; a cancel) the
text is a prefix of valid JSON, as with OpenAI; only a reply that ended by its end-of-turn token is
complete, and that token is the only one allowed once the grammar is complete.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from functools import lru_cache
from typing import Any

import numpy as np

from engramctl.errors import UnsupportedModel, UnsupportedSchema

JSON_OBJECT = "json_object"  # the spec of OpenAI's {"type": "json_object"} and Ollama's format "json"
# A spec starting with this is a grammar in llguidance's Lark dialect (agent/tool_grammar.py: tool calls), not
# a JSON Schema; the header is llguidance's own way of saying so.
LARK_HEADER = "%llguidance {}\n"
MAX_SPEC_BYTES = 64 * 1024  # a schema is read, compiled and kept per request: a bound keeps that small
MAX_LARK_BYTES = 256 * 1024  # a tools grammar holds every declared function's schema
_COMPACT = {"whitespace_flexible": False}
_lock = threading.Lock()
_tokenizers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def grammar_spec(schema: Any) -> str:
    """What SamplingParams.grammar holds for a schema (a dict, as a request body gives it): its compact JSON
    text, keys in the order given (the reply writes properties in the schema's order). JSON_OBJECT stays."""
    if schema == JSON_OBJECT:
        return JSON_OBJECT
    if not isinstance(schema, dict):
        raise UnsupportedSchema(f"a JSON Schema is a JSON object (got {type(schema).__name__}).")
    spec = json.dumps(schema, separators=(",", ":"))
    if len(spec) > MAX_SPEC_BYTES:
        raise UnsupportedSchema(f"the JSON Schema is {len(spec)} bytes; at most {MAX_SPEC_BYTES} are accepted.")
    return spec


def lark_spec(grammar: str) -> str:
    """What SamplingParams.grammar holds for a Lark grammar (llguidance's dialect, `%json {...}` inside)."""
    spec = LARK_HEADER + grammar
    if len(spec) > MAX_LARK_BYTES:
        raise UnsupportedSchema(f"the tools' schemas are {len(spec)} bytes as a grammar; at most {MAX_LARK_BYTES}.")
    return spec


@lru_cache(maxsize=256)
def _grammar(spec: str) -> str:
    """llguidance's grammar for a spec, checked (UnsupportedSchema naming what it cannot enforce)."""
    import llguidance

    try:
        if spec.startswith(LARK_HEADER):
            grammar = llguidance.LLMatcher.grammar_from_lark(spec)
        else:
            schema = {"type": "object"} if spec == JSON_OBJECT else json.loads(spec)
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_COMPACT)
        error = llguidance.LLMatcher.validate_grammar(grammar)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - a Rust panic (pyo3's PanicException is a BaseException) or
        # whatever else a request's schema makes the library raise is the request's fault: a 400, never a 500
        raise UnsupportedSchema(f"the JSON Schema cannot be read: {str(e)[:300]}") from None
    if error:
        raise UnsupportedSchema(_explain(error))
    return grammar


def _explain(error: str) -> str:
    """llguidance's refusal as a sentence that names the schema feature."""
    keys = re.search(r"Unimplemented keys: \[(.*?)\]", error)  # a Lark grammar's %json says where first
    if keys:
        names = ", ".join(json.loads(f"[{keys.group(1)}]"))
        return f"the JSON Schema uses {names}, which structured output cannot enforce; leave it out."
    error = error.split("\n   1 | ", 1)[0]  # a Lark grammar's error quotes the grammar after it
    lines = [line.strip() for line in error.splitlines() if line.strip().strip("^")]  # a regex error spans lines
    return f"the JSON Schema is not supported: {' '.join(lines)[:300]}"


def check(spec: str) -> None:
    """Raises UnsupportedSchema when `spec` cannot be enforced; cheap once a spec has been seen."""
    _grammar(spec)


def ll_tokenizer(tokenizer: Any):
    """The llguidance tokenizer of an engine's tokenizer, built once (it reads every token's bytes)."""
    with _lock:
        built = _tokenizers.get(tokenizer)
        if built is None:
            built = _tokenizers[tokenizer] = _build(tokenizer)
        return built


def _build(tokenizer: Any):
    eos = sorted(tokenizer.eos_ids)
    vocab = getattr(tokenizer, "llama_vocab", None)
    if vocab is not None:  # engine/gguf_tokenizer.py: llama.cpp's own vocabulary and tokenizer
        from llguidance.llamacpp import lltokenizer_from_vocab

        return lltokenizer_from_vocab(vocab, eos_token=eos)
    from llguidance.hf import from_tokenizer  # engine/tokenizer.py: a transformers fast tokenizer

    try:
        return from_tokenizer(tokenizer.hf, eos_token=eos)
    except ValueError as e:  # a "slow" (pure Python) tokenizer: llguidance reads tokenizer.json
        raise UnsupportedModel(f"structured output needs a fast (tokenizer.json) tokenizer: {e}") from None


class Constraint:
    """One reply's grammar state: which tokens may come next, advanced by each token the reply keeps."""

    def __init__(self, spec: str, tokenizer: Any):
        import llguidance

        self._tok = ll_tokenizer(tokenizer)
        self._matcher = llguidance.LLMatcher(self._tok, _grammar(spec), log_level=0)
        if self._matcher.is_error():
            raise UnsupportedSchema(_explain(self._matcher.get_error()))
        self._eos = eos = sorted(tokenizer.eos_ids)
        self._fallback = eos[0] if eos else 0
        self._bits = np.zeros((self._tok.vocab_size + 31) // 32, dtype=np.int32)
        self._allowed: np.ndarray | None = None  # the last mask, one bool per token id

    def allowed(self, n_logits: int) -> np.ndarray:
        """Which of `n_logits` token ids may come next (ids past the tokenizer's vocabulary never)."""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        ok = np.unpackbits(self._bits.view(np.uint8), bitorder="little").view(bool)
        if ok.size < n_logits:
            ok = np.concatenate([ok, np.zeros(n_logits - ok.size, dtype=bool)])
        self._allowed = ok[:n_logits]
        return self._allowed

    def mask(self, logits) -> np.ndarray:
        """logits (vocab,) (numpy, or a torch tensor) as a new float32 array with every token the grammar
        forbids at -inf."""
        values = logits if isinstance(logits, np.ndarray) else logits.detach().float().cpu().numpy()
        return np.where(self.allowed(values.size), values, np.float32(-np.inf)).astype(np.float32, copy=False)

    def choose(self, token: int) -> int:
        """`token` if the last mask allows it, else an allowed one: a sampler that saw only -inf or NaN
        scores draws from the whole vocabulary, and the grammar must hold even then."""
        ok = self._allowed
        if ok is None or (0 <= token < ok.size and ok[token]):
            return token
        nonzero = np.flatnonzero(ok)
        return int(nonzero[0]) if nonzero.size else self._fallback

    def advance(self, token: int) -> None:
        """The reply keeps `token` (an end-of-turn id after the grammar is complete ends it)."""
        self._matcher.consume_token(token)
        self._allowed = None

    @property
    def complete(self) -> bool:
        """Whether the text so far is a whole value of the schema."""
        return self._matcher.is_accepting()
