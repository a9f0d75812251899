"""Snapshot file fuzz, long run (issue 12 item 2; the bounded run is tests/store/test_snapshot_fuzz.py).

    nice -n 19 .venv/bin/python scripts/fuzz_snapshots.py [--cases 100000] [--batch 10000] [--json out.json]

Draws damaged snapshot files with hypothesis (tests/snapshot_mutations.py: truncated, flipped bits,
mutated headers with a recomputed checksum, states that do not fit the model, foreign safetensors files,
raw header abuse, random bytes) and runs each through snapshot_file.decode and codec.from_payload, as a
restore does. Every case must end in a typed error (SnapshotCorrupt / SnapshotMismatch / UsageError) or,
for a change that means nothing, in the same state. The process runs under an address-space limit
(--limit-mb over its size at start), so a decoder that believed a header claiming terabytes would die
with MemoryError; each case's peak allocation is traced (tracemalloc) and compared with its file size,
and the slowest case is reported (a hang would show there).

Prints and optionally writes: cases, outcomes per kind, failures (none expected), CPU and wall time.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from tests import snapshot_mutations as mut  # noqa: E402


def _rss_limit(extra_mb: int) -> int:
    """Cap the address space at what the process maps now plus `extra_mb`."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    limit = pages * resource.getpagesize() + extra_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--limit-mb", type=int, default=1024, help="address space allowed above the start (MiB)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    base = mut.base_file()
    if mut.outcome(base) != ("accepted", ""):
        sys.exit("the valid file does not decode: fix that before fuzzing.")
    limit = _rss_limit(args.limit_mb)
    outcomes: collections.Counter = collections.Counter()
    failures: list[dict] = []
    worst = {"peak_over_size": 0.0, "slowest_s": 0.0, "slowest_cpu_s": 0.0, "slowest_kind": None, "max_peak_bytes": 0}
    done = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()

    def one(case) -> None:
        nonlocal done
        kind, buf = case
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            error, _message, peak = mut.traced_outcome(buf)
        except BaseException as e:  # noqa: BLE001 - every untyped exception is a finding
            failures.append({"kind": kind, "error": f"{type(e).__name__}: {e}"[:300], "file": buf[:200].hex()})
            error, peak = "FAILED", 0
        dt, dcpu = time.perf_counter() - t0, time.process_time() - c0
        worst["slowest_cpu_s"] = max(worst["slowest_cpu_s"], round(dcpu, 4))
        if error == "accepted" and (
            kind.startswith(("state:", "foreign", "random", "truncated")) or not mut.same_state(buf, base)
        ):
            failures.append({"kind": kind, "error": "accepted a file that must be refused", "file": buf[:200].hex()})
        outcomes[(kind.split(":")[0], error)] += 1
        if peak > mut.allocation_bound(buf):
            failures.append({"kind": kind, "error": f"allocated {peak} bytes for a {len(buf)}-byte file"})
        worst["max_peak_bytes"] = max(worst["max_peak_bytes"], peak)
        worst["peak_over_size"] = max(worst["peak_over_size"], peak / max(len(buf), 1))
        if dt > worst["slowest_s"]:
            worst["slowest_s"], worst["slowest_kind"] = round(dt, 4), kind
        done += 1

    batch = 0
    while done < args.cases:
        n = min(args.batch, args.cases - done)
        run = settings(
            max_examples=n,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )(seed(batch)(given(mut.damaged(base))(one)))
        start = done
        run()
        batch += 1
        print(f"batch {batch}: {done - start} cases ({done} in all), {len(failures)} failures", flush=True)
        if done == start:
            break  # hypothesis found nothing new to draw
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    report = {
        "cases": done,
        "failures": len(failures),
        "first_failures": failures[:10],
        "outcomes": {f"{k} -> {e}": n for (k, e), n in sorted(outcomes.items())},
        "max_peak_alloc_bytes": worst["max_peak_bytes"],
        "max_peak_over_file_size": round(worst["peak_over_size"], 2),
        "slowest_case_s": worst["slowest_s"],
        "slowest_case_kind": worst["slowest_kind"],
        "slowest_case_cpu_s": worst["slowest_cpu_s"],  # wall time above includes waiting for a shared CPU
        "address_space_limit_mb": limit // 2**20,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "cases_per_s": round(done / wall, 1),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
