"""Child process for the crash test: 50 saves with a mix of pins, labels, branches, gc and flushes.
Prints each step's number as soon as its commit returned; the parent SIGKILLs it at a random one."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from payloads import make_payload  # noqa: E402

from engramctl.errors import NotFound  # noqa: E402
from engramctl.settings import load_settings  # noqa: E402
from engramctl.store.store import Store  # noqa: E402
from engramctl.tiers.planner import TierPlanner  # noqa: E402


def main(seed: int, start: int, saves: int = 50) -> None:
    rng = random.Random(seed)
    settings = load_settings({"keep_last": 4, "tier_ram_bytes": "3MB", "tier_disk_bytes": "40MB"})
    store = Store.open(settings)
    TierPlanner.start(settings, store.retention)
    print("open", flush=True)
    for i in range(start, start + saves):
        name = f"s{rng.randrange(4)}"
        payload = make_payload(rng.randint(20, 300), i, width=rng.choice([1, 16, 64]), blocks=i % 2 == 0)
        rec = store.snapshots.commit(name, payload, messages=[{"role": "user", "content": f"turn {i}"}])
        r = rng.random()
        if r < 0.08:
            store.snapshots.pin(rec.id)
        elif r < 0.16:
            store.snapshots.label(rec.id, f"label {i}")
        elif r < 0.24:
            store.sessions.branch(rec.id, f"b{i}")
        elif r < 0.30:
            store.retention.gc()
        elif r < 0.36:
            store.flush()
        elif r < 0.40 and store.snapshots.list(name):
            try:
                store.snapshots.load(store.snapshots.list(name)[0].id)
            except NotFound:  # the writer thread's keep-last retention retired it between list and load
                pass
        print(i, flush=True)
    store.flush()
    print("done", flush=True)
    store.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
