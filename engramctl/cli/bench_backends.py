"""`engramctl bench backends`: the same preset on transformers and on llama.cpp, on one device, side by side.

Registered by cli/bench.py as `bench backends`. The measuring is engramctl.bench.backends'; this module parses
the options and draws the table through the output module. Nothing heavy is imported at module level.
"""

from __future__ import annotations

from typing import Any, Optional

import typer


def backends(
    preset: str = typer.Option(
        "granite-4.0-h-350m", "--preset", help="Random-weight model to build: granite-4.0-h-350m or tiny."
    ),
    device: Optional[str] = typer.Option(
        None, "--device", help="auto | cpu | cuda, the same for both backends (default: settings)."
    ),
    dtype: Optional[str] = typer.Option(
        None, "--dtype", help="transformers' weights: float32 | bfloat16 | float16 (default: float32 for a preset)."
    ),
    gguf_type: str = typer.Option(
        "f16", "--gguf-type", metavar="f16|q8_0|f32", help="llama.cpp's weights: the preset converted once to a GGUF."
    ),
    prefill_tokens: int = typer.Option(512, "--prefill-tokens", min=1, help="Tokens prefilled from a fresh state."),
    decode_tokens: int = typer.Option(64, "--decode-tokens", min=1, help="Tokens decoded greedily after it."),
    runs: int = typer.Option(3, "--runs", min=1, help="Measured runs per backend, ABBA, after one warm-up each."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="CPU threads of torch and of llama.cpp."),
    seed: int = typer.Option(0, "--seed", help="Seed of the preset weights and the prompt."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object on stdout instead of the table."),
) -> None:
    """Prefill tokens/s and decode ms/token of one preset on the transformers backend and on the llama.cpp
    backend (a GGUF converted from the same weights), on the same device, in one run: which to pick on this
    machine. Each row names its device, weights and build; transformers' also says whether mamba-ssm /
    causal-conv1d or PyTorch's fallback runs the recurrent layers."""
    from engramctl.bench.backends import BackendsConfig, run_backends, with_command
    from engramctl.bench.gguf_presets import gguf_type as check_type
    from engramctl.bench.presets import preset_name
    from engramctl.cli import common
    from engramctl.cli.bench_console import RichProgress, warn_daemon
    from engramctl.cli.output import Output

    st = common.settings(device=device, dtype=dtype)
    cfg = BackendsConfig(
        preset=preset_name(preset),
        seed=seed,
        device=st.device,
        dtype=st.dtype,
        gguf_type=check_type(gguf_type),
        prefill_tokens=prefill_tokens,
        decode_tokens=decode_tokens,
        runs=runs,
        threads=threads,
    )
    cfg = with_command(cfg)
    out = Output()
    warn_daemon(st, out)
    with RichProgress() as progress:
        result = run_backends(cfg, st, progress)
    if json_out:
        out.emit_json(result)
    else:
        out.line(render(result))


def render(result: dict[str, Any]) -> str:
    from engramctl.cli.bench_format import fmt_spread, fmt_x, table

    def times(v: float | None) -> str:
        return fmt_x(v) if v is None or v >= 1 else f"{v:.2f}x"

    s = result["settings"]
    runs = f"{s['runs']} run{'s' if s['runs'] != 1 else ''}"
    head = (
        f"SAME MODEL  preset {s['preset']} (seed {s['seed']}) on {s['device']}: {s['prefill_tokens']}-token prefill "
        f"from a fresh state, then {s['decode_tokens']} greedy decode steps; {runs} each, {s['order']}"
    )
    rows = [
        [
            r["backend"],
            r["device"],
            r["weight_type"],
            "-" if not r["prefill_tokens_per_s"] else f"{r['prefill_tokens_per_s']:,.0f}",
            fmt_spread(r["prefill_ms"], r["prefill_spread_ms"]),
            fmt_spread(r["decode_ms_per_token"], r["decode_spread_ms"]),
        ]
        for r in result["backends"]
    ]
    headers = ["BACKEND", "DEVICE", "WEIGHTS", "PREFILL TOK/S", "PREFILL", "DECODE MS/TOKEN"]
    lines = [head, "", table(headers, rows, [False, False, False, True, True, True]), ""]
    for r in result["backends"]:
        lines.append(f"{r['backend']:<13} build {r['build'] or '-'}")
    for backend, why in result["skipped"].items():
        lines.append(f"{backend:<13} not measured: {why}")
    ratios = result["ratios"]
    if ratios:
        pre, dec = ratios["prefill_llama_cpp_speedup"], ratios["decode_llama_cpp_speedup"]
        lines += [
            "",
            f"llama.cpp vs transformers: prefill {times(pre)}, decode {times(dec)} as fast "
            f"(time on transformers / time on llama.cpp; below 1.0x transformers is faster)",
        ]
    lines += ["", f"command: {result['command']}"]
    return "\n".join(lines)
