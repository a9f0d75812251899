"""`engramctl bench ngram`'s result as text (the JSON object of engramctl.bench.workloads.ngram.bench), its
tables drawn like `engramctl bench`'s (bench_format.table)."""

from __future__ import annotations

from typing import Any

from engramctl.cli.bench_format import table
from engramctl.units import human_bytes

NAMES = {
    "A": "backbone alone",
    "B": "+ Engram, table in RAM",
    "C": "table on disk, read at the layer",
    "D": "table on disk, prefetched",
}


def _num(x: Any, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return table(header, rows).split("\n")


def render(r: dict[str, Any]) -> str:
    t, hw = r["table"], r["hardware"]
    lines = [
        f"engramctl bench ngram: {r['backbone']}",
        f"table: {t['rows']:,} rows x {t['row_bytes']} B = {human_bytes(t['size_bytes'])} "
        f"({t['rows_per_token']} rows per token; the planner puts it in {t['planner_tier']}); "
        f"cold reads: {r['cold_reads']}",
        f"RAM: {human_bytes(hw['ram_available_bytes'])} available, budget {human_bytes(hw['ram_budget_bytes'])}; "
        f"torch threads {hw['torch_threads']}",
        "",
    ]
    rows = []
    for v, s in r["variants"].items():
        rows.append(
            [
                f"{v}  {NAMES[v]}",
                _num(s["tokens_per_s"]),
                _num(s["prefill_tokens_per_s"]),
                _num(s["decode_tokens_per_s"]),
                _num(s["slowdown_vs_a"], 3),
                _num(s["slowdown_vs_b"], 3),
                _num(s["wait_ms"]),
                _num(s["cpu_per_wall"], 2),
            ]
        )
    lines += _table(["VARIANT", "TOK/S", "PREFILL", "DECODE", "VS A", "VS B", "WAIT MS", "CPU/WALL"], rows)
    ex = r["exact"]
    lines += ["", f"exact: C == B {ex['c_equals_b']}, D == B {ex['d_equals_b']} (final outputs, bitwise)", ""]
    size_rows = []
    for s in r["sizes"]:
        if s.get("skipped"):
            size_rows.append(
                [human_bytes(s["size_bytes"]), _num(s["x_free_ram"], 2), "skipped: " + s["skipped"], "", ""]
            )
            continue
        size_rows.append(
            [
                human_bytes(s["size_bytes"]),
                _num(s["x_free_ram"], 2),
                _num(s["tokens_per_s"]),
                _num(s["slowdown_vs_a"], 3),
                _num(s["wait_ms"]),
            ]
        )
    if size_rows:
        lines += ["E  D across table sizes"]
        lines += _table(["TABLE", "X FREE RAM", "TOK/S", "VS A", "WAIT MS"], size_rows)
        lines.append("")
    f = r.get("real_text")
    if f:
        c, u = f["corpus"], f["unique_rows_per_step"]
        lines += [
            f"F  real text: {c['tokens']:,} tokens of {c['source']} ({c['tokenizer']}, V' {c['compressed_vocab']:,})",
            f"unique rows per decode step: {u['decode_mean']} of {f['rows_per_step_before_dedupe']}; "
            f"per prefill chunk of {u['prefill_chunk_tokens']} tokens: {u['prefill_mean']} of "
            f"{u['prefill_rows_before_dedupe']}; distinct rows {f['distinct_rows']:,}",
        ]
        orders = list(f["lru"][0]["hit_rate_per_order"]) if f["lru"] else []
        lru_rows = [
            [f"{e['cache_rows']:,}", human_bytes(e["cache_bytes"]), _num(e["hit_rate"], 3)]
            + [_num(e["hit_rate_per_order"][o], 3) for o in orders]
            for e in f["lru"]
        ]
        lines += _table(["CACHE ROWS", "BYTES", "HIT RATE", *[f"{o}-GRAM" for o in orders]], lru_rows)
        lines.append(f"(no cache can beat {f['compulsory_hit_rate_bound']:.3f}: first reads of each row always miss)")
        lines.append("")
    lines.append("targets (reported, not enforced):")
    for name, tgt in r["targets"].items():
        if isinstance(tgt, dict):
            lines.append(f"  {name}: {tgt['value']} (target {tgt['target']}): {'met' if tgt['met'] else 'not met'}")
        else:
            lines.append(f"  {name}: {tgt}")
    lines.append(f"reproduce: {r['command']}")
    return "\n".join(lines)
