"""Issue 38 item 3's figures on this machine's llama.cpp build: how long resuming a parked conversation takes from
each place its state can be, for one model and state size, all in one run.

    python scripts/vram_tier_probe.py MODEL.gguf [--tokens 2048] [--repeats 20] [--json OUT.json]

Where a parked conversation's state comes from when it runs again (engine/llama_pool.py invariant 8):
- `device_copy_ms`: its device copy (engine/llama_device_copies.py, LLAMA_STATE_SEQ_FLAGS_ON_DEVICE), the VRAM tier;
- `blob_ms`: its host blob (llama_state_seq_set_data: one synchronous host-to-device copy per tensor on CUDA), what
  a conversation kept in RAM costs;
- `kept_ms`: a kept sequence sharing its cells (llama_pool.py invariant 4: no bytes move), for comparison;
- `h2d_floor_ms` (CUDA only, through torch): one copy of the blob's bytes from pinned host memory to the GPU, and
  `h2d_pageable_ms` from ordinary memory: the bus's floor the RAM tier is measured against (the target: within 1.3x);
- `step_ms` / `step_with_parked_ms`: one decode step of a conversation alone, and with `--resident` other
  conversations of the same length left in sequences of the context (the alternative mechanism, resident
  sequences: their cells widen the KV range every step reads), to show what parking them costs each step.
- `park_with_copy_ms` / `park_ms`: parking a conversation with a fresh device copy, or with its blob only: what
  making the copy adds to the turn that parks it.
Medians over `--repeats`; each restore is timed alone (the pool's solo() loading a conversation into an empty
context). Uses the backend's pool directly on purpose: it measures the mechanisms, not a daemon."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def _median_ms(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(out), 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--resident", type=int, default=3, help="conversations left resident for step_with_parked_ms")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from engramctl.engine.llama_backend import LlamaCppBackend

    backend = LlamaCppBackend(
        args.gguf,
        args.gguf.name,
        device=args.device,
        chunk_tokens=512,
        sequences=args.resident + 1,
        context_tokens=max(4096, (args.resident + 2) * (args.tokens + 64)),
        copies_bytes=None if args.device != "cpu" and _gpu(backend_lib()) else 4 << 30,
    )
    pool = backend._pool
    rng = np.random.default_rng(0)
    ids = [int(t) for t in rng.integers(10, backend.n_vocab - 10, args.tokens)]
    a, b = backend.new_live(), backend.new_live()
    backend.prefill(a, ids)
    state = backend.capture(a)  # kept while this reference lives: a kept sequence shares a's cells
    backend.prefill(b, ids[:64])  # parks a: with a device copy where the backend has slots
    copy, kept = a.cache.device, a.cache.kept
    figures: dict = {
        "model": args.gguf.name,
        "build": backend.info.build,
        "device": backend.info.device,
        "tokens": args.tokens,
        "state_bytes": len(a.cache.blob),
        "device_slots": backend.device_slots,
        "copies_rule": backend.copies_rule,
    }

    def resume_ms(device, kept_serial) -> float:
        """Median ms of loading a alone from the place named (a device copy, a kept sequence, else its blob)."""
        out = []
        for _ in range(args.repeats):
            pool.solo(b)
            pool.park_others([])  # b parked too, untimed: only a's load is timed
            a.cache.device, a.cache.kept = device, kept_serial
            t0 = time.perf_counter()
            pool.solo(a)
            out.append((time.perf_counter() - t0) * 1e3)
        return round(statistics.median(out), 3)

    def park_ms(with_copy: bool) -> float:
        """Median ms of parking b (resident alone, unchanged since its capture) with a fresh device copy or
        without one (its captured blob only): what a copy adds to the turn that parks it."""
        out, device = [], pool.device
        for _ in range(args.repeats):
            pool.solo(b)
            if b.cache.device is not None:
                device.drop(b.cache.device)
                b.cache.device = None
            pool.device = device if with_copy else None
            t0 = time.perf_counter()
            pool.park_others([])
            out.append((time.perf_counter() - t0) * 1e3)
            pool.device = device
        return round(statistics.median(out), 3)

    t_cpu, t_wall = time.process_time(), time.perf_counter()
    with backend._lock:
        before = dict(pool.restores)
        if copy is not None:
            figures["device_copy_ms"] = resume_ms(copy, None)
        figures["blob_ms"] = resume_ms(None, None)
        if pool.device is not None:
            backend.capture(b)  # b's blob at hand: parking it copies nothing to the host
            figures["park_with_copy_ms"], figures["park_ms"] = park_ms(True), park_ms(False)
        if kept is not None:  # the kept sequence goes when another path is loaded alone: measured last, once
            pool.solo(b)
            a.cache.device, a.cache.kept = None, kept
            t0 = time.perf_counter()
            pool.solo(a)
            figures["kept_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        figures["restores"] = {k: v - before.get(k, 0) for k, v in pool.restores.items()}
    del state
    floor = _h2d_floor(figures["state_bytes"], args.repeats)
    if floor:
        figures.update(floor)

    # one decode step alone, and beside `resident` other conversations left in sequences of the context
    token = int(a.last_logits.argmax())
    figures["step_ms"] = _median_ms(lambda: backend.step([(a, [token])]), args.repeats)
    others = [backend.new_live() for _ in range(args.resident)]
    for other in others:
        backend.prefill(other, ids)
    with backend._lock:
        pool.seat([a, *others])  # every one resident, none parked

        figures["step_with_parked_ms"] = _median_ms(lambda: backend._decode([(a, [token])], alone=False), args.repeats)
    figures["cpu_s"] = round(time.process_time() - t_cpu, 2)
    figures["wall_s"] = round(time.perf_counter() - t_wall, 2)
    text = json.dumps(figures, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


def backend_lib():
    from engramctl.engine.llama_lib import import_llama_cpp

    return import_llama_cpp()


def _gpu(lib) -> bool:
    return bool(lib.llama_supports_gpu_offload())


def _h2d_floor(nbytes: int, repeats: int) -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(nbytes, dtype=torch.uint8)

    def copy(src):
        def run():
            dev.copy_(src, non_blocking=False)
            torch.cuda.synchronize()

        return run

    copy(pinned)()  # warm
    return {
        "h2d_floor_ms": _median_ms(copy(pinned), repeats),
        "h2d_pageable_ms": _median_ms(copy(pageable), repeats),
    }


if __name__ == "__main__":
    sys.exit(main())
