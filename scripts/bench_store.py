"""Save/restore throughput of the snapshot store per tier, against raw bandwidths measured in the same run.

    .venv/bin/python scripts/bench_store.py [--state-mb 23] [--tokens 1000] [--repeat 10] [--json out.json]

The payload imitates a Granite-4.0-H-350M-shaped conversation state: a constant recurrent
part (--state-mb, float32 conv + SSM tensors over 28 layers) plus attention K/V of 8 KiB per token
over 4 layers, token ids and last logits. Everything runs in a temporary ENGRAM_HOME.

Reported per operation: median wall time, median CPU time (process-wide, so the writer thread's work
counts), and throughput = payload bytes / wall time. Baselines measured in the same run:
- memcpy: torch copy_ of a buffer of the payload's size into a preallocated one (RAM bandwidth);
- sequential write: write + fsync of a new file of that size (new files, as the store writes);
- sequential read, cold: readinto after posix_fadvise(DONTNEED) dropped the file from the page cache;
- sequential read, warm: the same file read again from the page cache.
Store operations:
- commit (hot): store.snapshots.commit returning (index transaction, RAM insert; the disk write is queued);
- commit + flush (disk write-through): encode, checksum, write, fsync, rename, index update;
- restore RAM: store.snapshots.load of a RAM-tier hit (no copy, the daemon's path) and with copy=True;
- restore disk, cold / warm: store.snapshots.load of a snapshot only on disk (read, verify checksum, decode);
  with --blocks its K/V is in shared KV blocks (store/blocks.py), as the daemon stores a state's, and a cold
  restore finds its blocks out of the page cache too;
- restore VRAM and promotion RAM->VRAM, only when CUDA is available.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from engramctl.bench.coldio import evict


def bench_payload(state_mb: float, n_tokens: int, seed: int = 0, blocks: bool = False) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    n_rec, n_att, kv_heads, head_dim = 28, 4, 4, 64  # 4 layers * 2 (k,v) * 4 heads * 64 * 4 B = 8 KiB/token
    per_layer = int(state_mb * 2**20 / 4 / n_rec)
    conv = per_layer // 8
    tensors: dict[str, torch.Tensor] = {}
    for i in range(n_rec):
        tensors[f"layers.{i}.conv"] = torch.randn(1, conv // 4, 4, generator=g)
        tensors[f"layers.{i}.recurrent"] = torch.randn(1, 1, per_layer - conv, generator=g)
    for j in range(n_att):
        for kind in ("keys", "values"):
            tensors[f"layers.{n_rec + j}.{kind}"] = torch.randn(1, kv_heads, n_tokens, head_dim, generator=g)
    tensors["token_ids"] = torch.randint(0, 49152, (n_tokens,), generator=g)
    tensors["last_logits"] = torch.randn(49152, generator=g)
    meta = {
        "n_tokens": str(n_tokens),
        "fingerprint": "bench",
        "model_id": "bench/granite-like",
        "dtype": "float32",
        "text": "x" * 100,
    }
    if blocks:  # the K/V's token axis named, as state/codec.to_payload names it: stored as shared KV blocks
        axes = {f"layers.{n_rec + j}.{kind}": 2 for j in range(n_att) for kind in ("keys", "values")}
        meta["token_axes"] = json.dumps(axes, separators=(",", ":"))
    return tensors, meta


def nbytes(payload) -> int:
    return sum(t.numel() * t.element_size() for t in payload[0].values())


def timed(fn, repeat: int, setup=None) -> dict:
    walls, cpus = [], []
    for _ in range(repeat):
        if setup:
            setup()
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "min_wall_s": min(walls)}


def baselines(size: int, tmp: Path, repeat: int) -> dict:
    src = torch.empty(size // 4, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in
    out = {"memcpy": timed(lambda: dst.copy_(src), repeat)}
    data = bytes(src.numpy().tobytes())

    written = iter(range(10**6))

    def write():  # a new file each time, kept, like the store's snapshot files
        with open(tmp / f"raw{next(written)}.bin", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    out["seq_write_fsync"] = timed(write, repeat)
    path = tmp / "raw0.bin"
    buf = bytearray(size)

    def read():
        with open(path, "rb", buffering=0) as f:
            f.readinto(buf)

    out["seq_read_cold"] = timed(read, repeat, setup=lambda: evict(path))
    out["seq_read_warm"] = timed(read, repeat)
    for p in tmp.glob("raw*.bin"):
        p.unlink()
    return out


def codec(payload, repeat: int) -> dict:
    """The CPU part of a save and a load: snapshot_file.encode (serialize + checksum) and decode (verify + parse)."""
    from engramctl.store import snapshot_file

    buf = snapshot_file.encode(*payload)
    return {
        "encode": timed(lambda: snapshot_file.encode(*payload), repeat),
        "decode": timed(lambda: snapshot_file.decode(buf), repeat),
    }


def store_ops(payload, repeat: int, home: Path) -> dict:
    os.environ["ENGRAM_HOME"] = str(home)
    from engramctl.settings import load_settings
    from engramctl.store.store import Store
    from engramctl.tiers.planner import TierPlanner

    def open_store(settings):
        store = Store.open(settings)
        TierPlanner.start(settings, store.retention)  # the store keeps the plan it follows
        return store

    size = nbytes(payload)
    settings = load_settings(
        {"tier_ram_bytes": size * (repeat + 4), "tier_disk_bytes": size * (repeat * 4 + 8), "keep_last": 10_000}
    )
    out: dict = {}
    store = open_store(settings)
    ids: list[str] = []
    out["commit_hot"] = timed(
        lambda: ids.append(store.snapshots.commit("bench", payload).id), repeat, setup=store.flush
    )
    store.flush()
    out["commit_flush_disk"] = timed(
        lambda: (ids.append(store.snapshots.commit("bench", payload).id), store.flush()), repeat
    )
    hot = ids[-1]
    store.snapshots.load(hot)
    out["restore_ram"] = timed(lambda: store.snapshots.load(hot), repeat)
    out["restore_ram_copy"] = timed(lambda: store.snapshots.load(hot, copy=True), repeat)
    store.close()

    def reopen_and_drop(cold: bool):
        nonlocal store
        store.close()
        store = open_store(settings)
        if cold:
            for p in [*(home / "snapshots").glob("*.safetensors"), *(home / "blocks").rglob("*")]:
                if p.is_file():
                    evict(p)

    pick = iter(ids * 4)
    store = open_store(settings)
    out["restore_disk_cold"] = timed(
        lambda: store.snapshots.load(next(pick)), repeat, setup=lambda: reopen_and_drop(True)
    )
    out["restore_disk_warm"] = timed(
        lambda: store.snapshots.load(next(pick)), repeat, setup=lambda: reopen_and_drop(False)
    )
    if torch.cuda.is_available():  # only when the engine has loaded torch with CUDA: a VRAM tier exists
        store.close()
        store = open_store(settings)
        if store.retention.plan.budget("vram") > 0:
            vid = ids[0]
            store.snapshots.load(vid)
            out["restore_vram"] = timed(lambda: (store.snapshots.load(vid), torch.cuda.synchronize()), repeat)

            def demote():
                store._placement.set_budget("vram", 0)
                store._placement.set_budget("vram", store.retention.plan.budget("vram"))

            out["promote_ram_to_vram"] = timed(
                lambda: (store.snapshots.load(vid), torch.cuda.synchronize()), repeat, setup=demote
            )
    store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-mb", type=float, default=23.0)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--blocks", action="store_true", help="store the K/V as shared KV blocks, as the daemon does")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    payload = bench_payload(args.state_mb, args.tokens, blocks=args.blocks)
    size = nbytes(payload)
    with tempfile.TemporaryDirectory(prefix="engram-bench-", dir=os.environ.get("BENCH_TMP")) as tmp:
        base = baselines(size, Path(tmp), args.repeat)
        parts = codec(payload, args.repeat)
        ops = store_ops(payload, args.repeat, Path(tmp) / "home")
    rows = {**{f"raw {k}": v for k, v in base.items()}, **{f"file {k}": v for k, v in parts.items()}, **ops}
    print(
        f"payload {size / 2**20:.1f} MiB ({args.state_mb} MiB state + {args.tokens} tokens), "
        f"median of {args.repeat}; {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}"
    )
    print(f"{'operation':<24} {'wall ms':>9} {'cpu ms':>9} {'GB/s':>8}")
    for name, r in rows.items():
        print(f"{name:<24} {r['wall_s'] * 1e3:9.2f} {r['cpu_s'] * 1e3:9.2f} {size / r['wall_s'] / 1e9:8.2f}")
    if args.json:
        args.json.write_text(json.dumps({"payload_bytes": size, "repeat": args.repeat, "results": rows}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
