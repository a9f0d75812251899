"""Medians and ratios of `engramctl bench ngram`'s timed runs."""

from __future__ import annotations

import statistics
from typing import Any


def summary(samples: list[dict]) -> dict[str, Any]:
    def med(key: str):
        vals = [s[key] for s in samples if s.get(key) is not None]
        return round(statistics.median(vals), 3) if vals else None

    tps = [s["tokens_per_s"] for s in samples if s.get("tokens_per_s")]
    return {
        "tokens_per_s": med("tokens_per_s"),
        "spread_tokens_per_s": [round(min(tps), 3), round(max(tps), 3)] if tps else None,
        "prefill_tokens_per_s": med("prefill_tokens_per_s"),
        "decode_tokens_per_s": med("decode_tokens_per_s"),
        "cpu_per_wall": med("cpu_per_wall"),
        "wait_ms": med("wait_ms"),
        "unique_rows_per_step": med("unique_rows_per_step"),
        "n": len(samples),
    }


def ratio(x: float | None, y: float | None) -> float | None:
    """How many times slower x is than y (throughputs): y / x."""
    return round(y / x, 4) if x and y else None


def at_most(x, y) -> bool | None:
    return None if x is None else x <= y


def above(x, y) -> bool | None:
    return None if x is None else x > y
