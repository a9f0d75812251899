"""`engramctl bench`: restore against re-prefill, per tier, against the bandwidth floor, and the
multi-turn savings, measured on this machine; `engramctl bench ngram`: N-gram memory tables in RAM and on
disk, with and without prefetch (the shape of the Engram paper's Table 4; scripts/ngram_standin.py runs the
same harness on a stand-in backbone). The reports are drawn by cli/bench_report.py and cli/bench_ngram_report.py.
Registered by the root app as

    app.add_typer(bench.app, name="bench")   # `bench` runs bench(); `bench ngram` runs ngram(); `bench backends`:
                                             # cli/bench_backends.py

Nothing heavy is imported at module level (torch loads inside the command).
"""

from __future__ import annotations

from typing import Optional

import typer

from engramctl.cli import bench_backends, bench_serve
from engramctl.cli.bench_ngram import ngram
from engramctl.cli.common import counts
from engramctl.errors import UsageError

QUICK = {
    "contexts": (256, 1024),
    "turns": 10,
    "runs": 2,
    "reply_tokens": 16,
    "floor_bytes": 64 << 20,
    "prefill_tokens": 128,
    "decode_tokens": 16,
}
# 2,048 is in the sweep because the restore target (restore <= 1.3x bytes / memcpy) is stated there
FULL = {
    "contexts": (256, 1024, 2048, 4096),
    "turns": 20,
    "runs": 3,
    "reply_tokens": 64,
    "floor_bytes": 256 << 20,
    "prefill_tokens": 512,
    "decode_tokens": 64,
}


def bench(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(
        None, "--model", "-m", help="Model directory, .gguf file or hub id (default: a preset)."
    ),
    contexts: Optional[str] = typer.Option(
        None,
        "--contexts",
        help="Context lengths to sweep, comma-separated (default 256,1024,2048,4096; --quick 256,1024).",
    ),
    turns: Optional[int] = typer.Option(
        None, "--turns", min=0, help="Turns of the multi-turn chat (default 20; --quick 10; 0 skips it)."
    ),
    runs: Optional[int] = typer.Option(
        None, "--runs", min=1, help="Measured runs per context, after one warm-up (default 3; --quick 2)."
    ),
    quick: bool = typer.Option(
        False, "--quick", help="A short run (under 2 minutes on CPU): the tiny preset unless --model/--preset is given."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object on stdout instead of the tables."),
    plot: Optional[str] = typer.Option(
        None,
        "--plot",
        metavar="FILE.png",
        help="Also draw the results into a PNG (needs matplotlib: pip install 'engramctl[plot]').",
    ),
    preset: Optional[str] = typer.Option(
        None,
        "--preset",
        help="Random-weight model to build: granite-4.0-h-350m (default) or tiny (default with --quick).",
    ),
    reply_tokens: Optional[int] = typer.Option(
        None, "--reply-tokens", min=1, help="Tokens generated per chat reply (default 64; --quick 16)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the preset weights and the token material."),
    device: Optional[str] = typer.Option(None, "--device", help="auto | cpu | cuda (default: settings)."),
    dtype: Optional[str] = typer.Option(
        None, "--dtype", help="auto | float32 | bfloat16 | float16 (default: settings; presets: float32)."
    ),
    backend: Optional[str] = typer.Option(
        None,
        "--backend",
        metavar="auto|transformers|llama.cpp",
        help="What runs the model (default: settings, auto). "
        "A preset on llama.cpp is converted once to a cached GGUF (see --gguf-type).",
    ),
    gguf_type: Optional[str] = typer.Option(
        None,
        "--gguf-type",
        metavar="f16|q8_0|f32",
        help="Weight type of a preset converted for llama.cpp (default f16); implies --backend llama.cpp for a preset.",
    ),
    prefill_tokens: Optional[int] = typer.Option(
        None,
        "--prefill-tokens",
        min=0,
        help="Speed workload: tokens prefilled before decoding (default 512; --quick 128; 0 skips it).",
    ),
    decode_tokens: Optional[int] = typer.Option(
        None, "--decode-tokens", min=1, help="Speed workload: tokens decoded per run (default 64; --quick 16)."
    ),
    threads: Optional[int] = typer.Option(
        None,
        "--threads",
        min=1,
        help="CPU threads of torch and of llama.cpp "
        "(default: torch's choice; llama.cpp: the cores this process may use).",
    ),
    wait_idle: float = typer.Option(
        0.0,
        "--wait-idle",
        metavar="SECONDS",
        help="Wait up to this long for other processes to go idle before measuring.",
    ),
    keep_data: bool = typer.Option(
        False, "--keep-data", help="Keep the bench's snapshot store (a bench-* dir under the data dir)."
    ),
) -> None:
    """Measure restore against re-prefill on this machine: a context sweep (re-prefill vs restore from
    RAM and from a cold disk, time to first token of a new message both ways, snapshot size), the
    bandwidth floor measured in the same run, prefill and decode speed (on llama.cpp as ratios to raw
    llama-cpp-python on the same GGUF), a multi-turn chat stateful vs stateless, and snapshot saves
    against the stream. Tables on stdout, progress on stderr; --json for one JSON object.
    `engramctl bench ngram --help`: the N-gram memory benchmark."""
    if ctx.invoked_subcommand is not None:  # `bench ngram`: this group callback has nothing to do
        return
    from engramctl.bench.config import BenchConfig
    from engramctl.bench.runner import run_bench
    from engramctl.cli import common
    from engramctl.cli.bench_console import RichProgress, warn_daemon
    from engramctl.cli.output import Output

    if model is not None and preset is not None:
        raise UsageError("--model and --preset cannot be combined.", hint="pick one")
    if plot is not None:
        from engramctl.cli.bench_plot import require_matplotlib

        if not plot.lower().endswith(".png"):
            raise UsageError(f"--plot {plot!r} must name a .png file.")
        require_matplotlib()
    d = QUICK if quick else FULL
    if model is None:
        from engramctl.bench.presets import preset_name

        preset = preset_name(preset or ("tiny" if quick else "granite-4.0-h-350m"))
    st = common.settings(device=device, dtype=dtype, backend=backend)
    chosen = st.backend
    if gguf_type is not None:
        from engramctl.bench.gguf_presets import gguf_type as check_type

        gguf_type = check_type(gguf_type)
        if model is not None:
            raise UsageError("--gguf-type converts a preset; a --model GGUF keeps its own weight type.")
        if chosen == "transformers":
            raise UsageError(
                "--gguf-type runs the preset on llama.cpp; it cannot be combined with --backend transformers."
            )
        chosen = "llama.cpp"
    cfg = BenchConfig(
        contexts=counts(contexts, "--contexts", "256,1024,4096") if contexts is not None else d["contexts"],
        turns=d["turns"] if turns is None else turns,
        runs=d["runs"] if runs is None else runs,
        reply_tokens=d["reply_tokens"] if reply_tokens is None else reply_tokens,
        seed=seed,
        quick=quick,
        model=model,
        preset=preset,
        device=st.device,
        dtype=st.dtype,
        threads=threads,
        memcpy_bytes=d["floor_bytes"],
        disk_bytes=d["floor_bytes"],
        wait_idle_s=wait_idle,
        keep_data=keep_data,
        backend=chosen,
        gguf_type=gguf_type or "f16",
        prefill_tokens=d["prefill_tokens"] if prefill_tokens is None else prefill_tokens,
        decode_tokens=d["decode_tokens"] if decode_tokens is None else decode_tokens,
    )
    cfg = _with_command(cfg)
    out = Output()
    warn_daemon(st, out)
    with RichProgress() as progress:
        result = run_bench(cfg, st, progress)
    if plot is not None:
        from engramctl.cli.bench_plot import plot as draw

        draw(result, plot)
        result["plot"] = plot
    if json_out:
        out.emit_json(result)
    else:
        from engramctl.cli.bench_report import render

        out.line(render(result))
    if plot is not None:
        out.note(f"plot written to {plot}")


def _with_command(cfg):
    """The exact command that reproduces this run, for the report."""
    import dataclasses
    import shlex

    from engramctl.bench.config import engine_flags

    parts = ["engramctl", "bench"]
    parts += ["--model", cfg.model] if cfg.model else ["--preset", cfg.preset]
    if cfg.quick:
        parts.append("--quick")
    if cfg.backend != "auto":
        parts += ["--backend", cfg.backend]
    if cfg.model is None and cfg.backend == "llama.cpp":
        parts += ["--gguf-type", cfg.gguf_type]
    parts += [
        "--contexts",
        ",".join(str(c) for c in cfg.contexts),
        "--turns",
        str(cfg.turns),
        "--runs",
        str(cfg.runs),
        "--reply-tokens",
        str(cfg.reply_tokens),
        "--prefill-tokens",
        str(cfg.prefill_tokens),
        "--decode-tokens",
        str(cfg.decode_tokens),
        "--seed",
        str(cfg.seed),
    ]
    parts += engine_flags(cfg.threads, cfg.device, cfg.dtype)
    return dataclasses.replace(cfg, command=shlex.join(parts))  # quoted: --contexts '' or a path with spaces


app = typer.Typer(
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.callback(invoke_without_command=True)(bench)
app.command("ngram")(ngram)
app.command("serve")(bench_serve.serve)
app.command("backends")(bench_backends.backends)
