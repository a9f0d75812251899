"""The store at a home lab's scale: does a write cost the same at 10,000 snapshots as at 100? (issue 46, item 1)

    .venv/bin/python scripts/bench_store_scale.py [--snapshots 10000] [--sessions 1000] [--window 500] [--json out]
    .venv/bin/python scripts/bench_store_scale.py --read-only --home DIR

Fills a store in a temporary ENGRAM_HOME through its own API (Store.open, a TierPlanner, snapshots.commit, flush)
with --snapshots snapshots over --sessions sessions, as agents make them: every conversation starts with the same
system prompt, and each turn's state extends the one before it. A state is small and hybrid-like (a recurrent part,
one attention layer's K/V, token ids, last logits) with its K/V's token axis named as state/codec.to_payload names
it, so the store keeps the K/V in shared blocks as the daemon does. Every commit is flushed to disk before the next.

Printed: the median commit+flush wall and CPU time over the first 100 snapshots, then per window of --window
snapshots with its ratios (wall and CPU) to the first 100's. The first 100 and the last window are minutes apart,
so a machine whose load changes in between moves that ratio as much as the store does; the last window is therefore
also paired, commit by commit, with the same payloads committed into a reference store of 100-199 snapshots (a
copy of a store filled with 100 before the fill, a fresh copy every 100 paired commits, whole conversations in
each): `paired` is the ratio of the two at the same moments (--no-reference: not paired). Then, with the store
closed, Store.open's wall/CPU time (median of 3)
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
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
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


REFERENCE_SNAPSHOTS = 100  # the store the target compares with: "commit+flush at 10,000 within 1.2x of at 100"


def _settings(home: Path, keep_last: int):
    return load_settings({"keep_last": keep_last, "tier_ram_bytes": 64 * 2**20}, env={"ENGRAM_HOME": str(home)})


def _commit(store: Store, session: str, payload: tuple[dict, dict]) -> tuple[float, float]:
    """One commit, flushed to disk: (wall s, CPU s of this process, the writer thread's included)."""
    c0, w0 = time.process_time(), time.perf_counter()
    store.snapshots.commit(session, payload, messages=[{"role": "user", "content": "next"}])
    store.flush()
    return time.perf_counter() - w0, time.process_time() - c0


def _ms(seconds: list[float]) -> float:
    return round(1000 * statistics.median(seconds), 2)


class Reference:
    """Stores of REFERENCE_SNAPSHOTS snapshots to pair the last window's commits with: one filled once (not timed)
    and closed, then a fresh copy of it for each run of `per_copy` paired commits, so the reference holds 100 to
    199 snapshots when it is timed; each copy's snapshots are loaded first (not timed), so that its RAM tier is
    full as the filled store's is."""

    def __init__(self, root: Path, keep_last: int, turns: int, system: tuple[np.ndarray, np.ndarray]):
        self.root, self.keep_last, self.per_copy = root, keep_last, REFERENCE_SNAPSHOTS
        self.template = root / "template"
        with Store.open(_settings(self.template, keep_last)) as store:
            TierPlanner.start(store.settings, store.retention)
            for s in range(-(-REFERENCE_SNAPSHOTS // turns)):
                conv = Conversation(np.random.default_rng(500_000 + s), *system)
                for _ in range(turns):
                    _commit(store, f"ref-{s:05d}", conv.turn())
        self.store: Store | None = None
        self.home: Path | None = None
        self.copies = self.paired = 0

    def next_session(self) -> Store:
        """The store to pair the next conversation with: a fresh copy once the current one took per_copy commits."""
        if self.store is None or self.paired >= self.per_copy:
            self.close()
            self.home = self.root / f"copy-{self.copies}"
            shutil.copytree(self.template, self.home)
            self.copies += 1
            self.store = Store.open(_settings(self.home, self.keep_last))
            TierPlanner.start(self.store.settings, self.store.retention)
            # its RAM tier full, as the filled store's is: a commit then evicts a hot copy in both, not in one
            for rec in self.store.snapshots.list():
                self.store.snapshots.load(rec.id)
            self.paired = 0
        return self.store

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            shutil.rmtree(self.home)
            self.store = None


def fill(home: Path, n_snapshots: int, n_sessions: int, window: int, reference: bool = True) -> dict:
    turns = n_snapshots // n_sessions
    keep_last = turns + 8
    settings = _settings(home, keep_last)
    rng = np.random.default_rng(0)
    system_ids = rng.integers(3, VOCAB, SYSTEM_TOKENS, dtype=np.int64)
    system_kv = rng.standard_normal((2, KV_HEADS, SYSTEM_TOKENS, HEAD_DIM), dtype=np.float32)
    rows, walls, cpus = [], [], []
    first_100: dict = {}
    paired = {"store_wall": [], "store_cpu": [], "ref_wall": [], "ref_cpu": []}
    with tempfile.TemporaryDirectory(prefix="engram-scale-ref-") as ref_root, Store.open(settings) as store:
        ref = Reference(Path(ref_root), keep_last, turns, (system_ids, system_kv)) if reference else None
        TierPlanner.start(settings, store.retention)
        done = 0
        for s in range(n_sessions):
            conv = Conversation(np.random.default_rng(1000 + s), system_ids, system_kv)
            # the last window's conversations, whole, go to a reference store too (the same payloads, alternately
            # first and second, so neither gets the warmer caches every time)
            ref_store = ref.next_session() if ref is not None and done >= n_snapshots - window else None
            for _ in range(turns):
                payload = conv.turn()
                name = f"agent-{s:05d}"
                if ref_store is None:
                    wall, cpu = _commit(store, name, payload)
                else:
                    if done % 2:
                        ref_wall, ref_cpu = _commit(ref_store, name, payload)
                        wall, cpu = _commit(store, name, payload)
                    else:
                        wall, cpu = _commit(store, name, payload)
                        ref_wall, ref_cpu = _commit(ref_store, name, payload)
                    for key, value in zip(paired, (wall, cpu, ref_wall, ref_cpu)):
                        paired[key].append(value)
                walls.append(wall)
                cpus.append(cpu)
                done += 1
                if done == 100:  # the target's reference: a store of 100 snapshots
                    first_100 = {"snapshots": 100, "commit_flush_ms": _ms(walls), "cpu_ms": _ms(cpus)}
                    print(json.dumps({"first_100": first_100}), flush=True)
                if done % window == 0:
                    row = {"snapshots": done, "commit_flush_ms": _ms(walls), "cpu_ms": _ms(cpus)}
                    row["vs_100"] = round(row["commit_flush_ms"] / first_100["commit_flush_ms"], 2)
                    row["cpu_vs_100"] = round(row["cpu_ms"] / first_100["cpu_ms"], 2)
                    rows.append(row)
                    print(json.dumps({"window": row}), flush=True)
                    walls, cpus = [], []
            if ref_store is not None:
                ref.paired += turns
        if ref is not None:
            ref.close()
        if store.write_errors:
            raise SystemExit(f"writes failed: {list(store.write_errors)}")
    out = {"windows": [first_100, *rows]}
    if paired["store_wall"]:
        out["paired"] = {
            "commits": len(paired["store_wall"]),
            "store_snapshots": f"{n_snapshots - window + 1}-{n_snapshots}",
            "reference_snapshots": f"{REFERENCE_SNAPSHOTS}-{REFERENCE_SNAPSHOTS + ref.per_copy - 1}",
            **{f"{key}_ms": _ms(values) for key, values in paired.items()},
        }
        p = out["paired"]
        p["vs_reference"] = round(p["store_wall_ms"] / p["ref_wall_ms"], 2)
        p["cpu_vs_reference"] = round(p["store_cpu_ms"] / p["ref_cpu_ms"], 2)
        print(json.dumps({"paired": p}), flush=True)
    return out


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
    child's user+sys), in ms, and the last run's stdout. Run from ENGRAM_HOME: `python -m` puts the working
    directory first on sys.path, and a checkout's root there would be the engramctl imported, whatever PYTHONPATH
    says."""
    run = partial(subprocess.run, [sys.executable, *args], env=env, cwd=env["ENGRAM_HOME"], capture_output=True)
    run(check=True)  # writes the bytecode
    walls, cpus = [], []
    out = b""
    for _ in range(repeat):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        out = run(check=True).stdout
        walls.append(time.perf_counter() - w0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return {"ms": round(1000 * statistics.median(walls), 1), "cpu_ms": round(1000 * statistics.median(cpus), 1)}, out


def time_ls(home: Path, repeat: int = 9) -> dict:
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
    ap.add_argument("--no-reference", action="store_true", help="do not pair the last window with a store of 100")
    ap.add_argument("--read-only", action="store_true", help="time open and ls of the store at --home, filled before")
    args = ap.parse_args()
    if args.read_only:
        if args.home is None:
            ap.error("--read-only needs --home")
        print(json.dumps({"open": time_open(args.home)}), flush=True)
        print(json.dumps({"ls": time_ls(args.home, repeat=11)}), flush=True)
        return 0
    if args.snapshots % args.sessions:
        ap.error("--snapshots must be a multiple of --sessions")
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="engram-scale-") as tmp:
        home = args.home or Path(tmp)
        filled = fill(home, args.snapshots, args.sessions, args.window, reference=not args.no_reference)
        opened = time_open(home)
        print(json.dumps({"open": opened}), flush=True)
        listed = time_ls(home)
        print(json.dumps({"ls": listed}), flush=True)
    first, last = filled["windows"][0], filled["windows"][-1]
    summary = {
        "snapshots": args.snapshots,
        "sessions": args.sessions,
        "first_100_ms": first["commit_flush_ms"],
        "first_100_cpu_ms": first["cpu_ms"],
        "last_window_ms": last["commit_flush_ms"],
        "last_window_cpu_ms": last["cpu_ms"],
        "last_vs_first_100": round(last["commit_flush_ms"] / first["commit_flush_ms"], 2),
        "cpu_last_vs_first_100": round(last["cpu_ms"] / first["cpu_ms"], 2),
    }
    if "paired" in filled:
        summary["paired_vs_reference"] = filled["paired"]["vs_reference"]
        summary["paired_cpu_vs_reference"] = filled["paired"]["cpu_vs_reference"]
    summary |= {
        "open_ms": opened["open_ms"],
        "open_cpu_ms": opened["cpu_ms"],
        "ls_json_ms": listed["ls_json_ms"],
        "ls_json_cpu_ms": listed["cpu_ms"],
        "load_average_before": load_before,
        "load_average_after": listed["load_average"],
    }
    print(json.dumps({"summary": summary}), flush=True)
    if args.json:
        args.json.write_text(json.dumps({**filled, "open": opened, "ls": listed, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
