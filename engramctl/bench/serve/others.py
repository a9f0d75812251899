"""Other sessions' snapshots in the daemon's store before it starts (`bench serve --other-snapshots N`), so the
workloads run against a store that has served many conversations, as a home lab's daemon in its second month.

    info = fill(home, gguf, 5000, seed)   # through the store's own API (Store.open, snapshots.commit), then closed

The snapshots are of the served model (its GGUF's fingerprint: every lookup of a prompt considers them)
but hold random token ids of many lengths, 5 per session (under keep-last-N), each with one transcript message
and a small state: they cost the index and the lookups what real ones cost, never a restore. Their sessions are
named OTHER_PREFIX...; the long conversation leaves them out of its own figures.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

OTHER_PREFIX = "bench-other-"
PER_SESSION = 5
MIN_TOKENS, MAX_TOKENS = 64, 4096


def fill(home: Path, gguf: Path, n_snapshots: int, seed: int) -> dict:
    """Commit `n_snapshots` snapshots of other sessions into the store under `home` and flush it. Returns what
    was written: snapshots, sessions, seconds."""
    from engramctl.engine.gguf_header import gguf_fingerprint, read_header
    from engramctl.settings import load_settings
    from engramctl.store.store import Store
    from engramctl.tiers.planner import TierPlanner

    t0 = time.perf_counter()
    header = read_header(gguf)
    fingerprint = gguf_fingerprint(header)
    settings = load_settings({"tier_ram_bytes": 0}, env={**os.environ, "ENGRAM_HOME": str(home)})
    settings.paths.ensure()
    rng = np.random.default_rng(seed)
    store = Store.open(settings)
    try:
        TierPlanner.start(settings, store.retention)
        sessions = max(1, -(-n_snapshots // PER_SESSION))
        for i in range(n_snapshots):
            n = int(rng.integers(MIN_TOKENS, MAX_TOKENS))
            tensors = {
                "layers.0.recurrent": rng.standard_normal(256, dtype=np.float32),
                "token_ids": rng.integers(3, 30000, n, dtype=np.int64),
                "last_logits": rng.standard_normal(64, dtype=np.float32),
            }
            meta = {"fingerprint": fingerprint, "model_id": gguf.name, "text": ""}
            message = {"role": "user", "content": f"another conversation's message {i}"}
            store.snapshots.commit(f"{OTHER_PREFIX}{i % sessions:05d}", (tensors, meta), messages=[message])
        store.flush()
    finally:
        store.close()
    return {
        "snapshots": n_snapshots,
        "sessions": sessions,
        "fill_s": round(time.perf_counter() - t0, 1),
    }
