"""Crash at every step, the long run (issue 12, item 3): >= 100 SIGKILLs of a daemon running a random
workload (streamed and plain chats, branches, imports, snapshot and session deletes, gc, with budgets
small enough that RAM eviction, keep-last retention and the disk budget act all the time). Half the
kills come at random moments, half at the armed kill points of engramctl/store/crashpoints.py in turn.
After every restart: the index and the files agree, every listed snapshot verifies and restores, every
answered turn is in its transcript (tests/daemon/harness.py, Workload.check).

    nice -n 19 .venv/bin/python scripts/crash_anywhere.py [--kills 100] [--seed 12] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.daemon import harness  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="engram-crash-"))
    model = args.model
    if model is None:
        from tests.factory import save_family

        model = root / "model"
        save_family("granitemoehybrid", model, seed=0, template="chatml")
    work = harness.Workload(rng, root / "data")
    cpu0, wall0 = harness.cpu_seconds(), time.perf_counter()
    results, failures = [], []
    for k in range(args.kills):
        point = None if k % 2 == 0 else harness.CRASH_POINTS[(k // 2) % len(harness.CRASH_POINTS)]
        r = harness.crash_cycle(model, work, rng, point)
        results.append(r)
        failures += r["problems_at_start"]
        print(json.dumps({"kill": k + 1, **r}), flush=True)
    final = harness.start(model, work.home, *harness.CRASH_ARGS)
    try:
        failures += work.check(final)
    finally:
        final.stop()
    kinds = Counter(r["point"].split(" ")[0] for r in results)
    out = {
        "kills": len(results),
        "by_point": dict(kinds),
        "armed_points_fired": sum(
            1 for r in results if "not reached" not in r["point"] and not r["point"].startswith("random")
        ),
        "kills_leaving_temp_files": sum(1 for r in results if r["temps_left"]),
        "kills_leaving_undurable_rows": sum(1 for r in results if r["undurable_rows"]),
        "ops": work.ops,
        "answered_turns_checked": sum(len(t) for t in work.answered.values()),
        "snapshot_restores_checked": work.checked_snapshots,
        "problems": failures,
        "cpu_s": round(harness.cpu_seconds() - cpu0, 1),
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps({**out, "cycles": results}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
