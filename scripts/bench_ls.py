"""`engramctl snapshots ls` as a user runs it, on a store that exists, beside its floors, in one interleaved run.

Each round runs, one after the other in fresh processes: Python's start alone (`python -c pass`), `snapshots ls
--json` on an empty ENGRAM_HOME (the imports and settings a listing pays before its first row), and `snapshots ls`
with the given arguments on --home; with --against, the same listing with another checkout's engramctl first on
the path (a before/after of one machine and one load: a round runs both, so a load that comes and goes weighs on
both alike). Printed (JSON on stdout): per command the median and lowest wall and CPU (the child's user+sys, from
wait4) in ms, over --rounds, the rows each --json listing lists, and the load average before and after.

    python scripts/bench_ls.py --home /tmp/scale10k                   # ls --json at 10,000 snapshots
    python scripts/bench_ls.py --home /tmp/scale10k --against /tmp/before -- --session agent-00001

The bytecode is written first (a run that is not timed): a shell with PYTHONDONTWRITEBYTECODE would compile every
module of engramctl again at each start. A store to list is made by scripts/bench_store_scale.py --home DIR (kept).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """(wall, cpu) in ms of one run; the command must succeed. `cwd`: not a checkout's root (`python -m` puts the
    working directory first on sys.path: run from a checkout, every variant would import that checkout's
    engramctl, whatever PYTHONPATH says)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = 1000 * (time.perf_counter() - start)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({status}): {err[-2000:]}")
    return wall, 1000 * (usage.ru_utime + usage.ru_stime)


def _summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    walls, cpus = [w for w, _ in samples], [c for _, c in samples]
    return {
        "ms": round(statistics.median(walls), 1),
        "min_ms": round(min(walls), 1),
        "cpu_ms": round(statistics.median(cpus), 1),
        "min_cpu_ms": round(min(cpus), 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, required=True, help="the ENGRAM_HOME whose store is listed")
    ap.add_argument("--rounds", type=int, default=9, help="runs of each command (default 9)")
    ap.add_argument("--against", type=Path, help="another checkout's root, listed the same way in each round")
    ap.add_argument("args", nargs="*", help="ls's arguments after `--` (default: --json)")
    opts = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    ls = [sys.executable, "-m", "engramctl", "snapshots", "ls", *(opts.args or ["--json"])]
    with tempfile.TemporaryDirectory(prefix="engram-empty-") as empty:
        commands = {
            "python": ([sys.executable, "-c", "pass"], base),
            "ls_empty": (
                [sys.executable, "-m", "engramctl", "snapshots", "ls", "--json"],
                {**base, "ENGRAM_HOME": empty, "PYTHONPATH": str(ROOT)},
            ),
            "ls": (ls, {**base, "ENGRAM_HOME": str(opts.home), "PYTHONPATH": str(ROOT)}),
        }
        if opts.against:
            commands["ls_against"] = (ls, {**base, "ENGRAM_HOME": str(opts.home), "PYTHONPATH": str(opts.against)})
        where = {}  # which engramctl each listing imports, as it runs (a check on PYTHONPATH and cwd)
        rows = {}  # what each --json listing lists: a store that an open emptied lists fast, and nothing
        for name, (cmd, env) in commands.items():  # the bytecode, written once, not timed
            _run(cmd, env, empty)
            if name != "python":
                probe = [sys.executable, "-c", "import engramctl; print(engramctl.__file__)"]
                where[name] = subprocess.run(
                    probe, env=env, cwd=empty, capture_output=True, text=True, check=True
                ).stdout.strip()
                if "--json" in cmd:
                    listed = subprocess.run(cmd, env=env, cwd=empty, capture_output=True, check=True).stdout
                    rows[name] = len(json.loads(listed))
        load_before = os.getloadavg()
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(opts.rounds):
            for name, (cmd, env) in commands.items():
                samples[name].append(_run(cmd, env, empty))
    report = {name: _summary(s) for name, s in samples.items()}
    report["rounds"] = opts.rounds
    report["rows"] = rows
    report["engramctl"] = where
    report["load_average"] = {
        "before": [round(x, 2) for x in load_before],
        "after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
