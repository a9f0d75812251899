"""The turn after a restart, with and without the prefetch (daemon/prefetch.py), on one model, in one run.

    python scripts/prefetch_check.py MODEL [--tokens 2048] [--device auto] [--json out.json]

Starts the daemon (tests/daemon/harness.py) on a fresh data directory, holds one conversation whose first prompt
is about --tokens tokens, stops it, then starts it twice over copies of that directory: once as it is (the
prefetch loads the session's head into RAM before the turn) and once with --tier-ram-bytes 0 (nothing can be
prefetched: the turn reads the disk). Prints and writes, per start: the warm-up, what was prefetched and how long it
took, and the next turn's tier, restore_ms and ttft_ms, beside the first turn's prefill_ms (what re-reading the
conversation costs). Run from the repository root; scripts/device_run.sh runs it on a lent GPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.daemon import harness

TEXT = "the state of a conversation moves at the speed of the machine that holds it"


def _prompt(n_tokens: int) -> str:
    # about one token per word on the tokenizers here; the daemon reports the real count
    words = TEXT.split()
    return " ".join(words[i % len(words)] for i in range(n_tokens))


def _turn(h, content: str, max_tokens: int = 4) -> dict:
    return harness.chat(h, "check", [{"role": "user", "content": content}], max_tokens)["engram"]


def _wait_prefetch(h, timeout: float = 300.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = h.get("/v1/status").json()
        if (status.get("prefetched") or {}).get("done", True):
            return status
        time.sleep(0.02)
    raise SystemExit("the prefetch did not finish in time")


def _durable(h, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(s["durable"] for s in h.post("/list_snapshots", json={}).json()["snapshots"]):
        if time.monotonic() > deadline:
            raise SystemExit("the snapshots were not written in time")
        time.sleep(0.05)


def _restart(model: Path, home: Path, args: list[str], *extra: str) -> dict:
    d = harness.start(model, home, *args, *extra, timeout=600)
    try:
        with d.http(600) as h:
            status = _wait_prefetch(h)
            turn = _turn(h, "And one more question.")
    finally:
        d.stop()
    keys = ("tier", "restored_tokens", "restore_ms", "ttft_ms", "prefill_ms")
    return {"warmup_ms": status.get("warmup_ms"), "prefetched": status.get("prefetched"), **{k: turn[k] for k in keys}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    args = ["--device", a.device]
    with tempfile.TemporaryDirectory(prefix="engram-prefetch-") as tmp:
        home = Path(tmp) / "home"
        d = harness.start(a.model, home, *args, timeout=600)
        try:
            with d.http(600) as h:
                first = _turn(h, _prompt(a.tokens))
                _turn(h, "Say more.")
                _durable(h)
        finally:
            d.stop()
        cold = Path(tmp) / "cold"
        shutil.copytree(home, cold, ignore=shutil.ignore_patterns("run", "*.log"))
        out = {
            "model": str(a.model),
            "device": a.device,
            "first_turn": {k: first[k] for k in ("prompt_tokens", "prefill_ms", "ttft_ms")},
            "prefetched": _restart(a.model, home, args),
            "disk": _restart(a.model, cold, args, "--tier-ram-bytes", "0"),
        }
    p, c = out["prefetched"], out["disk"]
    print(
        f"first turn: {out['first_turn']['prompt_tokens']} tokens prefilled in {out['first_turn']['prefill_ms']} ms\n"
        f"after a restart, prefetched: tier {p['tier']}, restore {p['restore_ms']} ms, ttft {p['ttft_ms']} ms "
        f"(warm-up {p['warmup_ms']} ms; prefetch {p['prefetched']})\n"
        f"after a restart, no RAM tier: tier {c['tier']}, restore {c['restore_ms']} ms, ttft {c['ttft_ms']} ms"
    )
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
