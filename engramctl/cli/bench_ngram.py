"""`engramctl bench ngram`: N-gram memory tables in RAM and on disk, with and without prefetch, on the engine
serving a bench preset model (the shape of the Engram paper's Table 4; the harness is
engramctl/bench/workloads/ngram.py, its report cli/bench_ngram_report.py)."""

from __future__ import annotations

from typing import Optional

import typer

from engramctl.errors import UsageError

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
    ngram_layer: int = typer.Option(1, "--ngram-layer", min=0, help="Block index of the N-gram layer (0-based)."),
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
    N-gram layer whose table is in RAM, (C) the table on disk read at the layer, (D) on disk and prefetched
    while the earlier blocks compute, (E) D across table sizes, and (F) on real text, the hit rate of an LRU
    RAM cache of disk rows per n-gram order and the unique rows per step. Tables on stdout, progress on
    stderr; --json for one JSON object. Disk use: one table at a time, the largest of --sizes."""
    import dataclasses
    import shlex

    from engramctl.bench.workloads.ngram import NgramBenchConfig
    from engramctl.bench.workloads.ngram import bench as run_ngram
    from engramctl.cli import common
    from engramctl.cli.bench_console import RichProgress, warn_daemon
    from engramctl.cli.output import Output
    from engramctl.units import parse_bytes

    d = NGRAM_QUICK if quick else NGRAM_FULL
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu or cuda; got {device!r}.")
    from engramctl.bench.presets import preset_name

    preset = preset_name(preset or ("tiny" if quick else "granite-4.0-h-350m"))
    cfg = NgramBenchConfig(
        preset=preset,
        ngram_layer=ngram_layer,
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
    parts += ["--ngram-layer", str(ngram_layer), "--read", read, "--io-threads", str(io_threads)]
    parts += [x for c in cfg.corpus for x in ("--corpus", c)] + ["--corpus-tokens", str(cfg.corpus_tokens)]
    parts += ["--seed", str(seed), "--device", device] + (["--threads", str(threads)] if threads else [])
    cfg = dataclasses.replace(cfg, command=shlex.join(parts))
    cfg.validate()
    out = Output()
    warn_daemon(common.settings(), out)
    with RichProgress() as progress:
        result = run_ngram(cfg, common.settings(), progress)
    if json_out:
        out.emit_json(result)
    else:
        from engramctl.cli.bench_ngram_report import render

        out.line(render(result))
