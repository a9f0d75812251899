"""Does llama.cpp decode as fast from another thread than the one that loaded the model? Per library build.

    .venv/bin/python scripts/bench_threads.py [--gguf FILE | --preset granite-4.0-h-350m --gguf-type q8_0]
        [--lib DIR ...] [--runs 5] [--threads 2] [--json]

For each llama.cpp library (ours, as scripts/setup.sh builds it, plus every --lib DIR holding another build's
libllama.so, e.g. llama-server's OpenMP build under <cache dir>/llama-server/), a child process loads the GGUF
through LlamaCppBackend on its main thread, then prefills 512 tokens and decodes 64 on that same thread
("same") and on a new thread ("other"), interleaved over --runs. Prints medians with spreads and
CPU time / wall per placement. The figures are in docs/llama-threads.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

PREFILL, DECODE = 512, 64


def child(gguf: str, runs: int, threads: int) -> dict:
    from engramctl.engine.llama_backend import LlamaCppBackend
    from engramctl.engine.llama_lib import openmp_linked

    backend = LlamaCppBackend(gguf, "bench", threads=threads)
    ids = [(i * 7919) % 1000 + 10 for i in range(PREFILL)]

    def once(out: dict) -> None:
        live = backend.new_live()
        c0, t0 = time.process_time(), time.perf_counter()
        logits = backend.prefill(live, ids)
        t1 = time.perf_counter()
        for _ in range(DECODE):
            logits = backend.decode(live, int(logits.argmax()))
        t2, c2 = time.perf_counter(), time.process_time()
        backend.release(live)
        out.update(prefill_ms=(t1 - t0) * 1000, decode_ms=(t2 - t1) * 1000 / DECODE, cpu_per_wall=(c2 - c0) / (t2 - t0))

    results: dict[str, list[dict]] = {"same": [], "other": []}
    once({})  # warm-up on the loading thread
    for run in range(runs):
        for where in ("same", "other") if run % 2 == 0 else ("other", "same"):
            out: dict = {}
            if where == "same":
                once(out)
            else:
                t = threading.Thread(target=once, args=(out,))
                t.start()
                t.join()
            results[where].append(out)
    return {"openmp": openmp_linked(), "runs": results}


def summary(runs: list[dict], key: str) -> dict:
    vals = [r[key] for r in runs]
    return {"median": round(statistics.median(vals), 2), "spread": [round(min(vals), 2), round(max(vals), 2)]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf")
    ap.add_argument("--preset")
    ap.add_argument("--gguf-type", default="q8_0")
    ap.add_argument("--lib", action="append", default=[], help="a directory holding another build's libllama.so")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.gguf, a.runs, a.threads)))
        return 0
    gguf = a.gguf
    if gguf is None and a.preset:
        from engramctl.bench.gguf_presets import preset_gguf
        from engramctl.settings import load_settings

        gguf = str(preset_gguf(a.preset, 0, a.gguf_type, load_settings().paths.cache_dir, print))
    if gguf is None:
        from engramctl.engine.loading import smollm2_gguf

        gguf = str(smollm2_gguf())
    rows = []
    for lib in [None, *a.lib]:
        env = dict(os.environ)
        if lib:
            env |= {"LLAMA_CPP_LIB_PATH": lib, "LD_LIBRARY_PATH": lib}
        cmd = [sys.executable, __file__, "--child", "--gguf", gguf, "--runs", str(a.runs), "--threads", str(a.threads)]
        out = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
        for where, runs in out["runs"].items():
            rows.append(
                {
                    "library": lib or "ours (scripts/setup.sh)",
                    "openmp": out["openmp"],
                    "thread": where,
                    "prefill_512_ms": summary(runs, "prefill_ms"),
                    "decode_ms_per_token": summary(runs, "decode_ms"),
                    "cpu_per_wall": summary(runs, "cpu_per_wall"),
                }
            )
    if a.json:
        print(json.dumps({"gguf": gguf, "threads": a.threads, "runs": a.runs, "rows": rows}, indent=1))
        return 0
    print(f"{os.path.basename(gguf)}, {a.threads} threads, {a.runs} runs (median [min-max])")
    for r in rows:
        p, d, c = r["prefill_512_ms"], r["decode_ms_per_token"], r["cpu_per_wall"]
        print(
            f"{'OpenMP' if r['openmp'] else 'no OpenMP':9}  {r['thread']:5}  "
            f"prefill 512: {p['median']} ms {p['spread']}"
            f"  decode: {d['median']} ms/token {d['spread']}  cpu/wall {c['median']}  ({r['library']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
