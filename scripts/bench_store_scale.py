"""The store at a home lab's scale: does a write cost the same at 10,000 snapshots as at 100? (issue 46, item 1)

    .venv/bin/python scripts/bench_store_scale.py [--snapshots 10000] [--sessions 1000] [--window 500] [--json out]
    .venv/bin/python scripts/bench_store_scale.py --read-only --home DIR

Fills a store in a temporary ENGRAM_HOME through its own API (Store.open, a TierPlanner, snapshots.commit, flush)
with --snapshots snapshots over --sessions sessions, as agents make them: every conversation starts with the same
system prompt, and each turn's state extends the one before it. A state is small and hybrid-like (a recurrent part,
one attention layer's K/V, token ids, last logits) with its K/V's token axis named as state/codec.to_payload names
it, so the store keeps the K/V in shared blocks as the daemon does. Every commit is flushed to disk before the next.

Printed: the median commit+flush wall and CPU time over the first 100 snapshots, then per window of --window
snapshots with its ratio to the first 100's; then, with the store closed, Store.open's wall/CPU time (median of 3)
and `engramctl snapshots ls --json` and `engramctl snapshots ls` (the table) run as a user runs them (a fresh
process, ENGRAM_HOME pointing at the filled store, no daemon): wall and CPU (the child's user+sys) per run, median
of 3 after one run not timed, with Python's bytecode cache on as installed (PYTHONDONTWRITEBYTECODE dropped for the
child), beside its floors (`python -c pass`; `ls --json` of an empty home: Python, the listing's imports and
settings; `engramctl --help`) and the load average. --read-only --home DIR times only the open and the listing of a
store filled before. Machine noise: read ratios within one run, not absolute figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engramctl.settings import load_settings
from engramctl.store.store import Store
from engramctl.tiers.planner import TierPlanner

VOCAB = 49152
SYSTEM_TOKENS = 256  # two full KV blocks every conversation shares
TURN_TOKENS = 48  # a turn's new tokens: a new block every few turns
KV_HEADS, HEAD_DIM = 2, 64  # one attention layer: 1 KiB of float32 K/V per token
RECURRENT_FLOATS = 8192  # 32 KiB of recurrent state


class Conversation:
    """One agent's conversation: the shared system prompt, then its own turns; each state extends the last."""

    def __init__(self, rng: np.random.Generator, system_ids: np.ndarray, system_kv: np.ndarray):
        self.rng = rng
        self.ids = system_ids.copy()
        self.kv = system_kv.copy()  # (2, kv_heads, tokens, head_dim): keys, values

    def turn(self) -> tuple[dict, dict]:
        new_ids = self.rng.integers(3, VOCAB, TURN_TOKENS, dtype=np.int64)
        new_kv = self.rng.standard_normal((2, KV_HEADS, TURN_TOKENS, HEAD_DIM), dtype=np.float32)
        self.ids = np.concatenate([self.ids, new_ids])
        self.kv = np.concatenate([self.kv, new_kv], axis=2)
        n = len(self.ids)
        tensors = {
            "layers.0.conv": self.rng.standard_normal((1, 256, 4), dtype=np.float32),
            "layers.0.recurrent": self.rng.standard_normal((1, RECURRENT_FLOATS // 256, 256), dtype=np.float32),
            "layers.1.keys": np.ascontiguousarray(self.kv[0][None]),
            "layers.1.values": np.ascontiguousarray(self.kv[1][None]),
            "token_ids": self.ids.copy(),
            "last_logits": self.rng.standard_normal(VOCAB, dtype=np.float32),
        }
        meta = {
            "n_tokens": str(n),
            "fingerprint": "bench-scale",
            "model_id": "bench/hybrid-like",
            "dtype": "float32",
            "text": "",
            "token_axes": json.dumps({"layers.1.keys": 2, "layers.1.values": 2}, separators=(",", ":")),
        }
        return tensors, meta


def fill(home: Path, n_snapshots: int, n_sessions: int, window: int) -> list[dict]:
    settings = load_settings(
        {"keep_last": n_snapshots // n_sessions + 8, "tier_ram_bytes": 64 * 2**20}, env={"ENGRAM_HOME": str(home)}
    )
    rng = np.random.default_rng(0)
    system_ids = rng.integers(3, VOCAB, SYSTEM_TOKENS, dtype=np.int64)
    system_kv = rng.standard_normal((2, KV_HEADS, SYSTEM_TOKENS, HEAD_DIM), dtype=np.float32)
    turns = n_snapshots // n_sessions
    rows, walls, cpus = [], [], []
    first_100: dict = {}
    with Store.open(settings) as store:
        TierPlanner.start(settings, store.retention)
        done = 0
        for s in range(n_sessions):
            conv = Conversation(np.random.default_rng(1000 + s), system_ids, system_kv)
            for _ in range(turns):
                payload = conv.turn()
                c0, w0 = time.process_time(), time.perf_counter()
                store.snapshots.commit(f"agent-{s:05d}", payload, messages=[{"role": "user", "content": "next"}])
                store.flush()
                walls.append(time.perf_counter() - w0)
                cpus.append(time.process_time() - c0)
                done += 1
                if done == 100:  # the target's reference: a store of 100 snapshots
                    first_100 = {
                        "snapshots": 100,
                        "commit_flush_ms": round(1000 * statistics.median(walls), 2),
                        "cpu_ms": round(1000 * statistics.median(cpus), 2),
                    }
                    print(json.dumps({"first_100": first_100}), flush=True)
                if done % window == 0:
                    row = {
                        "snapshots": done,
                        "commit_flush_ms": round(1000 * statistics.median(walls), 2),
                        "cpu_ms": round(1000 * statistics.median(cpus), 2),
                    }
                    row["vs_100"] = round(row["commit_flush_ms"] / first_100["commit_flush_ms"], 2)
                    rows.append(row)
                    print(json.dumps({"window": row}), flush=True)
                    walls, cpus = [], []
        if store.write_errors:
            raise SystemExit(f"writes failed: {list(store.write_errors)}")
    return [first_100, *rows]


def time_open(home: Path, repeat: int = 3) -> dict:
    settings = load_settings(env={"ENGRAM_HOME": str(home)})
    walls, cpus = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        store = Store.open(settings)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        n = len(store.snapshots.list())
        store.close()
    return {
        "open_ms": round(1000 * statistics.median(walls), 1),
        "cpu_ms": round(1000 * statistics.median(cpus), 1),
        "snapshots": n,
    }


def _child(args: list[str], env: dict, repeat: int) -> tuple[dict, bytes]:
    """A command run `repeat` times in a fresh process, after one run not timed: the median wall and CPU (the
    child's user+sys), in ms, and the last run's stdout."""
    subprocess.run([sys.executable, *args], env=env, capture_output=True, check=True)  # writes the bytecode
    walls, cpus = [], []
    out = b""
    for _ in range(repeat):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        out = subprocess.run([sys.executable, *args], env=env, capture_output=True, check=True).stdout
        walls.append(time.perf_counter() - w0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return {"ms": round(1000 * statistics.median(walls), 1), "cpu_ms": round(1000 * statistics.median(cpus), 1)}, out


def time_ls(home: Path, repeat: int = 3) -> dict:
    """`snapshots ls --json` and the human table, run as a user runs them, beside the floors measured in the same
    run: Python's start alone, and `engramctl --help` (the whole Typer app's imports)."""
    env = {**os.environ, "ENGRAM_HOME": str(home), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    # as installed: with the bytecode Python caches (a shell with PYTHONDONTWRITEBYTECODE compiles every module of
    # engramctl again at each start, a third of a small listing's time)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    listed, out = _child(["-m", "engramctl", "snapshots", "ls", "--json"], env, repeat)
    human, table = _child(["-m", "engramctl", "snapshots", "ls"], env, repeat)
    floors = {}
    with tempfile.TemporaryDirectory(prefix="engram-empty-") as empty:  # `ls --json` with no store: what it costs
        # before it lists (Python, its imports, the settings), the floor a listing of 10,000 adds its rows to
        floor, _ = _child(["-m", "engramctl", "snapshots", "ls", "--json"], {**env, "ENGRAM_HOME": empty}, repeat)
        floors["ls_empty_ms"], floors["ls_empty_cpu_ms"] = floor["ms"], floor["cpu_ms"]
    for name, args in (("python", ["-c", "pass"]), ("help", ["-m", "engramctl", "--help"])):
        floor, _ = _child(args, env, repeat)
        floors[f"{name}_ms"], floors[f"{name}_cpu_ms"] = floor["ms"], floor["cpu_ms"]
    return {
        "ls_json_ms": listed["ms"],
        "cpu_ms": listed["cpu_ms"],
        "rows": len(json.loads(out)),
        "ls_human_ms": human["ms"],
        "ls_human_cpu_ms": human["cpu_ms"],
        "table_lines": table.count(b"\n"),
        **floors,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--snapshots", type=int, default=10_000)
    ap.add_argument("--sessions", type=int, default=1_000)
    ap.add_argument("--window", type=int, default=500)
    ap.add_argument("--home", type=Path, help="fill this directory (kept) instead of a temporary one")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--read-only", action="store_true", help="time open and ls of the store at --home, filled before")
    args = ap.parse_args()
    if args.read_only:
        if args.home is None:
            ap.error("--read-only needs --home")
        print(json.dumps({"open": time_open(args.home)}), flush=True)
        print(json.dumps({"ls": time_ls(args.home, repeat=5)}), flush=True)
        return 0
    if args.snapshots % args.sessions:
        ap.error("--snapshots must be a multiple of --sessions")
    with tempfile.TemporaryDirectory(prefix="engram-scale-") as tmp:
        home = args.home or Path(tmp)
        windows = fill(home, args.snapshots, args.sessions, args.window)
        opened = time_open(home)
        print(json.dumps({"open": opened}), flush=True)
        listed = time_ls(home)
        print(json.dumps({"ls": listed}), flush=True)
    first, last = windows[0], windows[-1]
    summary = {
        "snapshots": args.snapshots,
        "sessions": args.sessions,
        "first_100_ms": first["commit_flush_ms"],
        "last_window_ms": last["commit_flush_ms"],
        "last_vs_first_100": round(last["commit_flush_ms"] / first["commit_flush_ms"], 2),
        "open_ms": opened["open_ms"],
        "ls_json_ms": listed["ls_json_ms"],
    }
    print(json.dumps({"summary": summary}), flush=True)
    if args.json:
        args.json.write_text(
            json.dumps({"windows": windows, "open": opened, "ls": listed, "summary": summary}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
