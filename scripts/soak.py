"""The long soak (issue 12, item 5): one daemon, >= 1,000 turns over >= 20 sessions, restores from RAM
and disk, branches and deletes; resident memory, open fds, threads, disk use and turn latency sampled.

    nice -n 19 .venv/bin/python scripts/soak.py [--turns 1000] [--sessions 25] [--model DIR|GGUF]

Without --model it builds the tests' tiny granitemoehybrid (random weights) under the home directory.
Exit status 1 if a limit is broken: RSS/fds/threads growth after warm-up > 5%, disk over its budget,
p99 of the last quarter > 2x that of the second.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.daemon import harness  # noqa: E402

DISK_BUDGET = 16 * 10**6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--sessions", type=int, default=25)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="engram-soak-"))
    model = args.model
    if model is None:
        from tests.factory import save_family

        model = home / "model"
        save_family("granitemoehybrid", model, seed=0, template="chatml")
    cpu0, wall0 = harness.cpu_seconds(), time.perf_counter()
    d = harness.start(model, home / "data", *harness.SOAK_ARGS)
    try:
        r = harness.soak(d, random.Random(args.seed), args.turns, args.sessions, samples=40, say=print)
        with d.http() as h:
            r["write_errors"] = h.get("/v1/status").json()["write_errors"]
    finally:
        d.stop()
    r["cpu_s"], r["wall_s"] = round(harness.cpu_seconds() - cpu0, 1), round(time.perf_counter() - wall0, 1)
    print(json.dumps({k: v for k, v in r.items() if k != "figures"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))
    ok = (
        r["rss_growth"] <= 0.05
        and r["fds"][1] <= r["fds"][0] * 1.05
        and r["threads"][1] <= r["threads"][0] * 1.05
        and r["disk_max"] <= DISK_BUDGET * 1.05
        and r["p99_ms_q4"] <= 2 * r["p99_ms_q2"]
        and not r["write_errors"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
