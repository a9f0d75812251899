"""What writing one snapshot file costs the writer thread: store/snapshot_file.py write_atomic (temp file, fsync,
rename, fsync the directory), with the written pages dropped from the page cache (as the store writes) and kept.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_snapshot_write.py [--mb 25] [--files 12] [--dir PATH] [--json]

A daemon writes two snapshots a turn (the prompt's and the reply's; ~25 MB each on the Granite-4.0-H-350M
preset, whose recurrent state is most of it) on its writer thread, and on a 2-core machine the CPU that thread
takes is taken from the decode threads. Each mode writes --files files of --mb MB into a fresh directory under
--dir (default: the system temp dir, which should be on the disk the store uses), keeping them all, as the store
keeps its files. Reported per file: the median and spread of the writer's CPU time (thread_time) and wall time.
The modes run in blocks of --files files, ABAB (two blocks each), so that load noise hits both; file by file
they would not be independent: pages one mode drops are what the other's next write takes, and a page the
kernel has had before is much cheaper to take than a fresh one (on a VM whose memory the host backs on first
touch, ~10x). The first 2 files of each block are left out (the block's start meets the other mode's pages).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from engramctl.store.snapshot_file import write_atomic

MODES = {"dropped": True, "cached": False}  # mode -> write_atomic's drop_cache
SETTLE = 2  # files at the start of each block left out of the figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=25, help="size of each file, MiB")
    ap.add_argument("--files", type=int, default=10, help="files written per block (2 blocks per mode)")
    ap.add_argument("--dir", type=Path, default=None, help="where the files go (default: the temp dir)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    buf = os.urandom(args.mb * 2**20)
    roots = {m: Path(tempfile.mkdtemp(prefix=f"snapwrite-{m}-", dir=args.dir)) for m in MODES}
    cpu_ms: dict[str, list[float]] = {m: [] for m in MODES}
    wall_ms: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        for block in range(2):
            for mode, drop in MODES.items():
                for i in range(args.files):
                    c0, w0 = time.thread_time(), time.perf_counter()
                    write_atomic(roots[mode] / f"{block}-{i}.safetensors", buf, drop_cache=drop)
                    if i >= SETTLE:
                        cpu_ms[mode].append((time.thread_time() - c0) * 1000)
                        wall_ms[mode].append((time.perf_counter() - w0) * 1000)
    finally:
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)
    result = {
        "mb": args.mb,
        "files_measured": 2 * (args.files - SETTLE),
        "modes": {
            m: {
                "cpu_ms_median": round(statistics.median(cpu_ms[m]), 1),
                "cpu_ms_spread": [round(min(cpu_ms[m]), 1), round(max(cpu_ms[m]), 1)],
                "wall_ms_median": round(statistics.median(wall_ms[m]), 1),
                "wall_ms_spread": [round(min(wall_ms[m]), 1), round(max(wall_ms[m]), 1)],
            }
            for m in MODES
        },
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"per {args.mb} MiB file, median of {result['files_measured']} per mode, writer thread")
    print(f"{'pages':10} {'cpu ms':>8} {'(spread)':>16} {'wall ms':>8} {'(spread)':>16}")
    for m, r in result["modes"].items():
        cs, ws = r["cpu_ms_spread"], r["wall_ms_spread"]
        print(
            f"{m:10} {r['cpu_ms_median']:8} {f'{cs[0]}-{cs[1]}':>16} {r['wall_ms_median']:8} {f'{ws[0]}-{ws[1]}':>16}"
        )


if __name__ == "__main__":
    main()
