"""Structured output's cost per constrained token on the loaded model: what masking the logits with the
grammar (engine/constraint.py) and advancing it adds to each decoded token, walked through a valid reply
of a nested schema token by token (the model's own tokenization of it), on logits of the model's size.
Also the one-time costs: building the grammar engine's tokenizer (once per tokenizer and process; the
daemon pays it on its first structured request) and compiling a schema (every request that brings one).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "status": {"enum": ["ok", "warn", "error"]},
        "owner": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "email": {"type": "string", "format": "email"}},
            "required": ["id", "email"],
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "qty": {"type": "number"}},
                "required": ["sku", "qty"],
            },
            "maxItems": 8,
        },
    },
    "required": ["name", "status", "owner", "items"],
}
REPLY = {
    "name": "Restock of the north warehouse",  # within maxLength 32
    "status": "warn",
    "owner": {"id": 7, "email": "ada@example.org"},
    "items": [{"sku": "ABC-1234", "qty": 2.5}, {"sku": "XYZ-0001", "qty": 10}, {"sku": "QRS-0420", "qty": 1}],
}


def measure(engine, runs: int) -> dict[str, Any]:
    from engramctl.engine.constraint import Constraint, check, grammar_spec, ll_tokenizer

    tok = engine.tokenizer
    t0 = time.perf_counter()
    ll_tokenizer(tok)  # the first call in this process builds it; later ones find it cached
    tokenizer_ms = (time.perf_counter() - t0) * 1e3
    spec = grammar_spec(SCHEMA)
    t0 = time.perf_counter()
    check(spec)
    compile_ms = (time.perf_counter() - t0) * 1e3
    ids = tok.encode(json.dumps(REPLY, separators=(",", ":")))
    live = engine.new_live()
    logits = engine.prefill(live, tok.encode("{"))  # real logits: the model's vocabulary size, its device
    engine.release(live)
    per_token_us: list[float] = []
    accepted = True  # every token of the valid reply allowed, and the reply complete at its end
    for _ in range(runs):
        c = Constraint(spec, tok)
        for token in ids:
            t0 = time.perf_counter()
            masked = c.mask(logits)  # what Sampler.pick adds before sampling ...
            c.advance(token)  # ... and Sampler.accept after
            per_token_us.append((time.perf_counter() - t0) * 1e6)
            accepted = accepted and bool(masked[token] > float("-inf"))
        accepted = accepted and c.complete
    ordered = sorted(per_token_us)
    return {
        "schema": "nested object, enum, email format, pattern, array of objects",
        "tokens": len(ids),
        "vocab": int(logits.shape[-1]),
        "runs": runs,
        "valid_reply_accepted": accepted,
        "tokenizer_build_ms": round(tokenizer_ms, 1),
        "schema_compile_ms": round(compile_ms, 2),
        "per_token_us": round(statistics.median(ordered), 1),
        "per_token_p95_us": round(ordered[int(0.95 * (len(ordered) - 1))], 1),
        "per_token_max_us": round(ordered[-1], 1),
    }
