"""What the kept ggml thread pool (engine/llama_threadpool.py) saves a generated token, against ggml's default of a
pool started and joined for every graph.

    .venv/bin/python scripts/bench_threadpool.py [--gguf FILE] [--rounds 8] [--tokens 64] [--threads 2]
                                                 [--between-us 300] [--json]

LlamaCppBackend loads the GGUF on the main thread (as the daemon does) and every decode runs on another thread (as
the daemon's worker). Each round: a fresh conversation, a 200-token prompt, then --tokens one-token decodes, the
pool attached and detached token by token (so drifting load hits both alike), with --between-us of busy Python
after each decode, standing in for the sampler and the stream's work between two tokens. Reported: the median
ms/token of each, the median of the per-round ratios (kept / per graph) and CPU time / wall.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

PROMPT = 200


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--between-us", type=int, default=300)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from engramctl.engine.llama_backend import LlamaCppBackend
    from engramctl.engine.loading import smollm2_gguf

    gguf = a.gguf or str(smollm2_gguf())
    backend = LlamaCppBackend(gguf, "bench", threads=a.threads)
    pool = backend._threadpool
    if pool is None:
        print("this llama.cpp offers no thread pool to attach", file=sys.stderr)
        return 1
    ids = [(i * 7919) % min(1000, backend.n_vocab - 10) + 10 for i in range(PROMPT)]
    times: dict[str, list[list[float]]] = {"kept": [], "per_graph": []}

    def spin(us: int) -> None:
        end = time.perf_counter() + us / 1e6
        while time.perf_counter() < end:
            pass

    def rounds() -> None:
        for r in range(a.rounds):
            live = backend.new_live()
            logits = backend.prefill(live, ids)
            per = {"kept": [], "per_graph": []}
            for i in range(a.tokens):
                mode = "kept" if (i + r) % 2 else "per_graph"
                if mode == "kept":
                    pool.reattach()
                else:
                    pool.detach()
                t0 = time.perf_counter()
                logits = backend.decode(live, int(logits.argmax()))
                per[mode].append((time.perf_counter() - t0) * 1000)
                spin(a.between_us)
            backend.release(live)
            for mode, v in per.items():
                times[mode].append(v)

    failed: list[BaseException] = []

    def run() -> None:
        try:
            rounds()
        except BaseException as e:  # noqa: BLE001 - re-raised on the main thread
            failed.append(e)

    c0, t0 = time.process_time(), time.perf_counter()
    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    cpu_per_wall = (time.process_time() - c0) / (time.perf_counter() - t0)
    backend.close()

    med = {m: statistics.median(x for run in v for x in run) for m, v in times.items()}
    ratios = [statistics.median(k) / statistics.median(p) for k, p in zip(times["kept"], times["per_graph"])]
    out = {
        "gguf": gguf,
        "threads": a.threads,
        "rounds": a.rounds,
        "tokens": a.tokens,
        "between_us": a.between_us,
        "ms_per_token": {m: round(v, 3) for m, v in med.items()},
        "kept_over_per_graph": {
            "median": round(statistics.median(ratios), 3),
            "spread": [round(min(ratios), 3), round(max(ratios), 3)],
        },
        "cpu_per_wall": round(cpu_per_wall, 2),
    }
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    r = out["kept_over_per_graph"]
    print(
        f"{os.path.basename(gguf)}, {a.threads} threads, {a.rounds} rounds x {a.tokens} tokens, "
        f"{a.between_us} us between tokens: kept pool {med['kept']:.3f} ms/token, a pool per graph "
        f"{med['per_graph']:.3f}; kept / per graph {r['median']} {r['spread']}; cpu/wall {out['cpu_per_wall']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
