"""`engramctl bench`: restore against re-prefill, per tier, against the bandwidth floor, and the
multi-turn savings, measured on this machine; `engramctl bench ngram`: N-gram memory tables in RAM and on
disk, with and without prefetch (the shape of the Engram paper's Table 4; scripts/ngram_standin.py runs the
same harness on a stand-in backbone). The reports are drawn by cli/bench_report.py and cli/bench_ngram_report.py.
Registered by the root app as

    app.add_typer(bench.app, name="bench")   # `bench` runs bench(); `bench ngram` runs ngram()

Nothing heavy is imported at module level (torch loads inside the command).
"""

from __future__ import annotations

from typing import Any, Optional

import typer

from engramctl.cli import bench_serve
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


def _contexts(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(
            f"--contexts {text!r} is not a comma-separated list of token counts.",
            hint="for example: --contexts 256,1024,4096",
        ) from None
    if any(v < 1 for v in values):
        raise UsageError("every --contexts value must be at least 1 token.")
    return tuple(sorted(set(values)))


class _RichProgress:
    """Progress bars on stderr (rich draws nothing when stderr is not a terminal)."""

    def __init__(self, quiet: bool = False) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.quiet = quiet
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self.tasks: dict[str, Any] = {}
        self.names: dict[str, str] = {}

    def __enter__(self) -> "_RichProgress":
        self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.stop()

    def phase(self, key: str, description: str, total: int) -> None:
        self.names[key] = description
        self.tasks[key] = self.bar.add_task(description, total=total)

    def advance(self, key: str, description: str | None = None) -> None:
        task = self.tasks.get(key)
        if task is None:
            return
        desc = f"{self.names[key]}: {description}" if description else None
        self.bar.update(task, advance=1, **({"description": desc} if desc else {}))

    def note(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)


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
    from engramctl.bench.runner import BenchConfig, run_bench
    from engramctl.cli import common
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
        contexts=_contexts(contexts) if contexts is not None else d["contexts"],
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
    _warn_daemon(st, out)
    with _RichProgress() as progress:
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
    if cfg.threads:
        parts += ["--threads", str(cfg.threads)]
    if cfg.device != "auto":
        parts += ["--device", cfg.device]
    if cfg.dtype != "auto":
        parts += ["--dtype", cfg.dtype]
    return dataclasses.replace(cfg, command=shlex.join(parts))  # quoted: --contexts '' or a path with spaces


def _warn_daemon(settings, out) -> None:
    """The bench runs in this process; a daemon with a model loaded competes for the same cores."""
    try:
        from engramctl.cli import daemonlink

        info = daemonlink.status(settings)
    except Exception:  # noqa: BLE001 - a status probe must never stop a benchmark
        return
    if info:
        out.warn(
            "an engramctl daemon is running; the bench runs in this process and competes with it "
            "for CPU and memory. Stop it for clean figures: engramctl daemon stop"
        )


NGRAM_QUICK = {"sizes": "16MiB,64MiB", "table_bytes": "32MiB", "runs": 2, "prefill": 64, "decode": 8, "corpus": 8000}
NGRAM_FULL = {
    "sizes": "64MiB,256MiB,1GiB",
    "table_bytes": "256MiB",
    "runs": 3,
    "prefill": 256,
    "decode": 32,
    "corpus": 50000,
}


def _sizes(text: str) -> tuple[int, ...]:
    from engramctl.units import parse_bytes

    values = tuple(parse_bytes(x.strip(), "--sizes") for x in text.split(",") if x.strip())
    if not values:
        raise UsageError("--sizes needs at least one table size.", hint="for example: --sizes 1GiB,8GiB,32GiB")
    return tuple(sorted(set(values)))


def ngram(
    quick: bool = typer.Option(False, "--quick", help="A short run: small tables (16-64 MiB), fewer tokens, 2 runs."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object on stdout instead of the tables."),
    runs: Optional[int] = typer.Option(None, "--runs", min=1, help="Measured runs per variant (default 3; median)."),
    table_bytes: Optional[str] = typer.Option(
        None, "--table-bytes", help="Size of the table of B, C and D (default 256MiB; --quick 32MiB)."
    ),
    sizes: Optional[str] = typer.Option(
        None,
        "--sizes",
        help="E: table sizes for D, comma-separated (default 64MiB,256MiB,1GiB: at most 1 GiB on disk at a time; "
        "--quick 16MiB,64MiB). Each is written, measured and deleted; sizes that do not fit the disk are skipped.",
    ),
    batch: int = typer.Option(8, "--batch", min=1, help="Sequences per step."),
    prefill_tokens: Optional[int] = typer.Option(
        None, "--prefill-tokens", min=0, help="Tokens per sequence prefilled in chunks (default 256; --quick 64)."
    ),
    chunk: int = typer.Option(128, "--chunk", min=1, help="Prefill chunk, tokens per sequence per step."),
    decode_tokens: Optional[int] = typer.Option(
        None, "--decode-tokens", min=1, help="Decode steps of one token per sequence (default 32; --quick 8)."
    ),
    preset: Optional[str] = typer.Option(
        None,
        "--preset",
        help="The bench preset model the engine serves (default granite-4.0-h-350m; --quick tiny).",
    ),
    engram_layer: int = typer.Option(1, "--engram-layer", min=0, help="Block index of the Engram layer (0-based)."),
    read: str = typer.Option(
        "pread", "--read", metavar="pread|direct", help="Disk reads: pread after posix_fadvise eviction, or O_DIRECT."
    ),
    io_threads: int = typer.Option(4, "--io-threads", min=1, help="Gather threads reading the table."),
    corpus: Optional[list[str]] = typer.Option(
        None, "--corpus", help="F: a text file (repeatable; default: CPython's documentation, pydoc_data)."
    ),
    corpus_tokens: Optional[int] = typer.Option(
        None, "--corpus-tokens", min=16, help="F: tokens of the corpus used (default 50,000; --quick 8,000)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights, the tables and the token ids."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="torch threads (default: torch's choice)."),
    device: str = typer.Option("cpu", "--device", metavar="cpu|cuda", help="Where the backbone runs."),
    keep_data: bool = typer.Option(False, "--keep-data", help="Keep the bench's tables (a bench-ngram-* dir)."),
) -> None:
    """N-gram memory (Engram) tables in the RAM and disk tiers, on the engine serving a bench preset model
    (random weights): tokens/s of (A) the backbone alone, (B) with an
    Engram layer whose table is in RAM, (C) the table on disk read at the layer, (D) on disk and prefetched
    while the earlier blocks compute, (E) D across table sizes, and (F) on real text, the hit rate of an LRU
    RAM cache of disk rows per n-gram order and the unique rows per step. Tables on stdout, progress on
    stderr; --json for one JSON object. Disk use: one table at a time, the largest of --sizes."""
    import dataclasses
    import shlex

    from engramctl.bench.workloads.ngram import NgramBenchConfig
    from engramctl.bench.workloads.ngram import bench as run_ngram
    from engramctl.cli import common
    from engramctl.cli.output import Output
    from engramctl.units import parse_bytes

    d = NGRAM_QUICK if quick else NGRAM_FULL
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu or cuda; got {device!r}.")
    from engramctl.bench.presets import preset_name

    preset = preset_name(preset or ("tiny" if quick else "granite-4.0-h-350m"))
    cfg = NgramBenchConfig(
        preset=preset,
        engram_layer=engram_layer,
        batch=batch,
        prefill_tokens=d["prefill"] if prefill_tokens is None else prefill_tokens,
        chunk=chunk,
        decode_tokens=d["decode"] if decode_tokens is None else decode_tokens,
        runs=d["runs"] if runs is None else runs,
        table_bytes=parse_bytes(table_bytes or d["table_bytes"], "--table-bytes"),
        sizes=_sizes(sizes or d["sizes"]),
        read_mode=read,
        io_threads=io_threads,
        corpus=tuple(corpus or ()),
        corpus_tokens=d["corpus"] if corpus_tokens is None else corpus_tokens,
        seed=seed,
        threads=threads,
        device=device,
        keep_data=keep_data,
    )
    parts = ["engramctl", "bench", "ngram", "--runs", str(cfg.runs), "--table-bytes", str(cfg.table_bytes)]
    parts += ["--sizes", ",".join(str(x) for x in cfg.sizes), "--batch", str(batch)]
    parts += ["--prefill-tokens", str(cfg.prefill_tokens), "--chunk", str(chunk)]
    parts += ["--decode-tokens", str(cfg.decode_tokens)]
    parts += ["--preset", preset]
    parts += ["--engram-layer", str(engram_layer), "--read", read, "--io-threads", str(io_threads)]
    parts += [x for c in cfg.corpus for x in ("--corpus", c)] + ["--corpus-tokens", str(cfg.corpus_tokens)]
    parts += ["--seed", str(seed), "--device", device] + (["--threads", str(threads)] if threads else [])
    cfg = dataclasses.replace(cfg, command=shlex.join(parts))
    cfg.validate()
    out = Output()
    _warn_daemon(common.settings(), out)
    with _RichProgress() as progress:
        result = run_ngram(cfg, common.settings(), progress)
    if json_out:
        out.emit_json(result)
    else:
        from engramctl.cli.bench_ngram_report import render

        out.line(render(result))


app = typer.Typer(
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.callback(invoke_without_command=True)(bench)
app.command("ngram")(ngram)
app.command("serve")(bench_serve.serve)
