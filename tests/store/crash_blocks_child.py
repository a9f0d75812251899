"""Child process for the KV block crash tests: one step of a conversation whose snapshots share KV blocks,
run with ENGRAM_TEST_CRASH_AT armed by the parent (store/crashpoints.py), which then reopens the store.

    base    session a: 300 tokens (full blocks, the rest in its own file); session q: 300 other tokens; a prefix
            state of 280 of a's tokens
    commit  session a: 560 tokens (its first blocks shared, new ones written), then a prefix state of 600 (all of
            560's blocks shared)
    delete  session a's head deleted (its new blocks freed, the shared ones still used), then session q (its
            blocks freed)
Prints "done" when the step finished (the kill point was not reached)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from payloads import make_payload, prefix_of  # noqa: E402

from engramctl.settings import load_settings  # noqa: E402
from engramctl.store.store import Store  # noqa: E402
from engramctl.tiers.planner import TierPlanner  # noqa: E402

FULL = make_payload(600, 7, blocks=True)
OTHER = make_payload(300, 8, blocks=True)


def main(step: str) -> None:
    settings = load_settings({"keep_last": 8, "tier_ram_bytes": "1MB", "tier_disk_bytes": "64MB"})
    store = Store.open(settings)
    TierPlanner.start(settings, store.retention)
    if step == "base":
        store.snapshots.commit("a", prefix_of(FULL, 300, 1), messages=[{"role": "user", "content": "one"}])
        store.snapshots.commit("q", OTHER, messages=[{"role": "user", "content": "other"}])
        tensors, meta = prefix_of(FULL, 280, 4)
        store.prefixes.put(tensors, meta, tensors["token_ids"].tolist())
    elif step == "commit":
        store.snapshots.commit("a", prefix_of(FULL, 560, 2), messages=[{"role": "user", "content": "two"}])
        store.flush()
        tensors, meta = prefix_of(FULL, 600, 3)
        store.prefixes.put(tensors, meta, tensors["token_ids"].tolist())
    elif step == "delete":
        store.snapshots.delete(store.sessions.get("a").head, force=True)
        store.delete_session("q")
    store.flush()
    print("done", flush=True)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1])
