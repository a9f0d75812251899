"""`engramctl bench`'s result as text: the header (bench_header.py), then one aligned table per workload,
drawn by output.py.

The JSON object itself is built by bench/runner.run_bench; its schema is documented in BENCHMARKS.md
("engramctl bench") and checked by tests/bench. The PNG plot is bench_plot.py's.
"""

from __future__ import annotations

from typing import Any

from engramctl.cli.bench_format import fmt_int, fmt_ms, fmt_rate, fmt_ratio, fmt_spread, fmt_x, table
from engramctl.cli.bench_header import header
from engramctl.cli.output import render_fields
from engramctl.units import human_bytes


def fmt_ms_per_token(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.1f} ms"


def speed_text(sp: dict[str, Any]) -> str:
    rows = []
    contenders = [
        ("engramctl", sp["engramctl"]),
        ("raw llama.cpp", sp.get("raw_llama_cpp")),
        ("transformers", sp.get("transformers")),
    ]
    for name, x in contenders:
        if not x:
            continue
        label = (
            f"{name} ({x.get('weight_type', 'same GGUF')})" if name != "raw llama.cpp" else "raw llama.cpp (same GGUF)"
        )
        prefill = fmt_spread(x["prefill_ms"], x.get("prefill_spread_ms"))
        if x.get("prefill_runs") == 1:
            prefill += " (1 run)"
        rows.append(
            [
                label,
                prefill,
                fmt_ratio(x["prefill_cpu_per_wall"]),
                "-" if x["prefill_tokens_per_s"] is None else f"{x['prefill_tokens_per_s']:,.0f}",
                fmt_ms_per_token(x["decode_ms_per_token"])
                + (
                    ""
                    if not x.get("decode_spread_ms")
                    else f" [{x['decode_spread_ms'][0]:.1f}-{x['decode_spread_ms'][1]:.1f}]"
                ),
                fmt_ratio(x["decode_cpu_per_wall"]),
            ]
        )
    t = table(["", f"prefill {sp['prefill_tokens']}", "cpu/wall", "tok/s", "decode per token", "cpu/wall"], rows)
    r = sp.get("ratios") or {}
    notes = [
        f"engramctl / raw llama.cpp: decode {fmt_ratio(r.get('decode_vs_raw_llama_cpp'))}, "
        f"prefill {fmt_ratio(r.get('prefill_vs_raw_llama_cpp'))} (1.00 = no overhead)"
        if sp.get("raw_llama_cpp")
        else f"raw llama.cpp reference: skipped, {sp.get('raw_skipped')}",
        f"decode speed-up over transformers: {fmt_x(r.get('decode_speedup_vs_transformers'))}"
        if sp.get("transformers")
        else f"transformers comparison: skipped, {sp.get('transformers_skipped')}",
    ]
    notes.append(
        "in-process: engramctl ran on the daemon's worker thread (the model was loaded on another), the raw "
        "reference on the loading thread; no HTTP (`engramctl bench serve` measures what a client sees)"
    )
    raw = sp.get("raw_llama_cpp") or {}
    if raw.get("settings"):
        st = raw["settings"]
        notes.append(
            f"raw llama.cpp context: n_ctx {st['n_ctx']}, n_batch {st['n_batch']}, n_ubatch {st['n_ubatch']}, "
            f"threads {st['threads']}/{st['threads_batch']}, flash attention"
        )
    return t + "\n" + "\n".join(notes)


def bandwidth_text(bw: dict[str, Any]) -> str:
    d = bw["disk_read"]
    cold = d.get("cached_fraction_before_read")
    cold_txt = "page cache state unknown" if cold is None else f"{cold:.0%} cached before each read"
    rows = [
        [
            "memcpy (torch copy_)",
            fmt_rate(bw["memcpy_bytes_per_s"]),
            human_bytes(bw["memcpy"]["bytes"]),
            fmt_ratio(bw["memcpy"]["cpu_per_wall"]),
            "",
        ],
        [
            "disk read, cold",
            fmt_rate(bw["disk_read_bytes_per_s"]),
            human_bytes(d["bytes"]),
            fmt_ratio(d["cpu_per_wall"]),
            f"evicted with fadvise; {cold_txt}",
        ],
        ["disk read, page cache", fmt_rate(bw.get("disk_read_warm_bytes_per_s")), human_bytes(d["bytes"]), "", ""],
    ]
    return table(["floor", "bandwidth", "size", "cpu/wall", "note"], rows, [False, True, True, True, False])


def contexts_text(rows: list[dict[str, Any]]) -> str:
    out = []
    for c in rows:
        sp, cw = c["spread_ms"], c["cpu_per_wall"]
        out.append(
            [
                fmt_int(c["tokens"]),
                human_bytes(c["snapshot_bytes"]),
                fmt_spread(c["prefill_ms"], sp.get("prefill")),
                fmt_ratio(cw.get("prefill")),
                fmt_spread(c["restore_ram_ms"], sp.get("restore_ram")),
                fmt_spread(c["restore_disk_ms"], sp.get("restore_disk")),
                fmt_ratio(cw.get("restore_disk")),
                fmt_x(c["speedup_restore_ram"]),
                fmt_x(c["speedup_restore_disk"]),
                fmt_ratio(c["restore_disk_efficiency"]),
            ]
        )
    t1 = table(
        [
            "tokens",
            "snapshot",
            "re-prefill",
            "cpu/wall",
            "restore ram",
            "restore disk",
            "cpu/wall",
            "x ram",
            "x disk",
            "disk eff",
        ],
        out,
    )
    out2 = []
    for c in rows:
        sp, cw = c["spread_ms"], c["cpu_per_wall"]
        out2.append(
            [
                fmt_int(c["tokens"]),
                fmt_spread(c["ttft_prefill_ms"], sp.get("ttft_prefill")),
                fmt_spread(c["ttft_restored_ms"], sp.get("ttft_restored")),
                fmt_spread(c["ttft_restored_disk_ms"], sp.get("ttft_restored_disk")),
                fmt_ratio(cw.get("ttft_restored")),
                fmt_x(c["speedup_ttft"]),
                fmt_ms(c["save_write_ms"]),
                f"{c['max_abs_logit_diff']:.1e}",
            ]
        )
    t2 = table(
        [
            "tokens",
            "ttft re-prefill",
            "ttft restored (ram)",
            "ttft restored (disk)",
            "cpu/wall",
            "x ttft",
            "save (fsync)",
            "logit diff",
        ],
        out2,
    )
    return t1 + "\n\n" + t2


def multiturn_text(mt: dict[str, Any]) -> str:
    if mt.get("skipped"):
        return f"skipped: {mt['skipped']}"
    a, b = mt["stateful"], mt["stateless"]
    comp = mt["prompt_tokens_computed"]
    summary = table(
        ["", "stateful", "stateless"],
        [
            ["prompt tokens computed", fmt_int(comp["stateful"]), fmt_int(comp["stateless"])],
            [
                "time per turn (median)",
                fmt_spread(a["time_per_turn_ms"], a["time_per_turn_spread_ms"]),
                fmt_spread(b["time_per_turn_ms"], b["time_per_turn_spread_ms"]),
            ],
            [
                "ttft (median)",
                fmt_spread(a["ttft_ms"], a["ttft_spread_ms"]),
                fmt_spread(b["ttft_ms"], b["ttft_spread_ms"]),
            ],
            ["ttft of the last turn", fmt_ms(a["last_turn_ttft_ms"]), fmt_ms(b["last_turn_ttft_ms"])],
            ["total time", fmt_ms(a["total_s"] * 1000), fmt_ms(b["total_s"] * 1000)],
            ["cpu/wall (median)", fmt_ratio(a["cpu_per_wall"]), fmt_ratio(b["cpu_per_wall"])],
        ],
        [False, True, True],
    )
    red = mt["token_reduction"]
    lines = [
        summary,
        "",
        f"token reduction: {'-' if red is None else f'{red:.1%}'} "
        f"(1 - {fmt_int(comp['stateful'])} / {fmt_int(comp['stateless'])}); prompt tokens sent: "
        f"{fmt_int(mt['prompt_tokens_sent'])}; identical replies: {mt['same_replies']}/{mt['turns']}; "
        f"template resets: {mt['resets']}",
        "",
    ]
    per = [
        [
            str(p["turn"]),
            fmt_int(p["prompt_tokens"]),
            fmt_int(p["computed_stateful"]),
            fmt_int(p["computed_stateless"]),
            fmt_ms(p["restore_ms"]),
            fmt_ms(p["ttft_stateful_ms"]),
            fmt_ms(p["ttft_stateless_ms"]),
            fmt_ms(p["time_stateful_ms"]),
            fmt_ms(p["time_stateless_ms"]),
            "yes" if p["same_reply"] else "no",
        ]
        for p in mt["per_turn"]
    ]
    lines.append(
        table(
            [
                "turn",
                "prompt",
                "computed sf",
                "computed sl",
                "restore",
                "ttft sf",
                "ttft sl",
                "time sf",
                "time sl",
                "same reply",
            ],
            per,
        )
    )
    return "\n".join(lines)


def save_text(s: dict[str, Any]) -> str:
    if not s.get("snapshots"):
        return "no snapshots saved (no multi-turn chat ran)"
    sp = s["spread_ms"]
    request = (
        f"settle {fmt_spread(s['settle_ms'], sp['settle'])}, capture {fmt_spread(s['capture_ms'], sp['capture'])}, "
        f"commit {fmt_spread(s['commit_ms'], sp['commit'])}; last token -> stream closed "
        f"{fmt_spread(s['stream_close_ms'], sp['stream_close'])}"
    )
    overlap = (
        f"{s['writes_after_turn_end']}/{s['snapshots']} writes finished after their turn returned (background); "
        f"durable before the next turn: {s['durable_before_next_turn']}/{max(0, s['turns'] - 1)} turns"
    )
    return render_fields(
        [
            (
                "snapshots",
                f"{s['snapshots']} (prompt + reply per turn), {human_bytes(int(s['snapshot_bytes'] or 0))} median",
            ),
            ("request thread", request),
            (
                "writer thread",
                f"commit -> durable {fmt_spread(s['write_ms'], sp['write'])} (encode, checksum, write, fsync)",
            ),
            (
                "last token",
                "not delayed: every save started after it" if s["after_last_token"] else "DELAYED by a save",
            ),
            ("overlap", overlap),
        ]
    )


def constrained_text(c: dict[str, Any]) -> str:
    return render_fields(
        [
            ("schema", f"{c['schema']}; a valid {c['tokens']}-token reply, {c['runs']} runs"),
            (
                "per token",
                f"{c['per_token_us']:.0f} us median, p95 {c['per_token_p95_us']:.0f} us, "
                f"max {c['per_token_max_us']:.0f} us (mask {c['vocab']:,} logits + advance the grammar)",
            ),
            ("schema compile", f"{c['schema_compile_ms']:.1f} ms per request"),
            ("tokenizer", f"{c['tokenizer_build_ms']:.0f} ms once per model and process"),
            ("valid reply", "accepted" if c["valid_reply_accepted"] else "REJECTED (a grammar bug)"),
        ]
    )


def targets_text(t: dict[str, Any]) -> str:
    names = {
        "restore_speedup_at_1024": ("restore >= 100x faster than re-prefill at 1,024 tokens", fmt_x),
        "restore_disk_efficiency": ("disk restore efficiency >= 0.75 (best context)", fmt_ratio),
        "token_reduction": (">= 95% fewer prompt tokens computed over the chat", lambda v: f"{v:.1%}"),
        "decode_vs_raw_llama_cpp": ("decode ms/token <= 1.10x raw llama.cpp's", fmt_ratio),
        "prefill_vs_raw_llama_cpp": ("prefill <= 1.05x raw llama.cpp's", fmt_ratio),
        "decode_speedup_vs_transformers": ("decode >= 4x faster than transformers", fmt_x),
        "restore_ram_vs_memcpy_at_2048": ("restore from RAM at 2,048 tokens <= 1.3x bytes / memcpy", fmt_ratio),
    }
    rows = [[names[k][0], names[k][1](v["measured"]), "met" if v["met"] else "NOT met"] for k, v in t.items()]
    restore = t.get("restore_ram_vs_memcpy_at_2048", {})
    if restore.get("after_other_vs_floor") is not None:  # context for the line above
        rows.append(
            ["  same, after another conversation ran", fmt_ratio(restore["after_other_vs_floor"]), "(reference)"]
        )
    if restore.get("vs_one_memcpy") is not None:  # what one plain memcpy of the same state costs here
        rows.append(
            ["  same / one single-threaded memcpy of the state", fmt_ratio(restore["vs_one_memcpy"]), "(reference)"]
        )
    if not rows:
        return "no target applies to this run"
    return table(["target (reported, not asserted)", "measured", ""], rows, [False, True, False])


def render(r: dict[str, Any]) -> str:
    parts = [header(r), "", "BANDWIDTH FLOOR (same run)", bandwidth_text(r["bandwidth"])]
    if r["contexts"]:
        parts += [
            "",
            f"CONTEXT SWEEP: re-prefill vs restore (new message: {r['contexts'][0]['message_tokens']} tokens)",
            contexts_text(r["contexts"]),
        ]
    mt = r["multiturn"]
    parts += [
        "",
        f"MULTI-TURN CHAT: {mt['turns']} turns, {mt.get('reply_tokens', '-')}-token replies, stateful vs stateless",
        multiturn_text(mt),
    ]
    sp = r.get("speed")
    if sp:
        parts += [
            "",
            f"SPEED: prefill {sp['prefill_tokens']} tokens, then decode {sp['decode_tokens']} (greedy), "
            "references in the same run",
            speed_text(sp),
        ]
    if r.get("constrained"):
        parts += ["", "STRUCTURED OUTPUT: cost per constrained token", constrained_text(r["constrained"])]
    parts += ["", "SNAPSHOT SAVES (stateful chat)", save_text(r["save"])]
    parts += ["", "TARGETS", targets_text(r["targets"])]
    return "\n".join(parts)
