"""The durability window: from a streamed reply's last token to its snapshots being durable on disk.

    nice -n 19 .venv/bin/python scripts/durability_window.py [--model GGUF] [--tokens 2048] [--turns 12]

A daemon serves the Granite-4.0-H-350M preset (random weights, the real shapes: bench/presets.py) as a
cached f16 GGUF on the llama.cpp backend (built on first use, ~1-2 min). One session is prefilled to
`--tokens` tokens of filler, then `--turns` short streamed turns follow; after each the client polls
/list_snapshots every 5 ms until both of the turn's snapshots (prompt and reply) are durable. The
window is that moment minus the arrival of the reply's last content piece, so it includes the end of
the stream (settle, capture, the in-memory commit) and the writer's encode + write + fsync + rename +
index commit. Then the daemon is SIGKILLed one second after a reply's last token and started again: the
reply's snapshot must be listed, durable, and restore (`kill check`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.daemon import harness  # noqa: E402


def default_model() -> Path:
    from engramctl.bench.gguf_presets import preset_gguf
    from engramctl.settings import load_settings

    cache = load_settings({}).paths.cache_dir
    return preset_gguf("granite-4.0-h-350m", 0, "f16", cache, say=print)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a GGUF (default: the 350M preset, converted and cached)")
    ap.add_argument("--backend", default="llama.cpp")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--home", type=Path, help="data dir (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    model = args.model or default_model()
    home = args.home or Path(tempfile.mkdtemp(prefix="engram-durability-"))
    cpu0, wall0 = harness.cpu_seconds(), time.perf_counter()
    from engramctl.bench.material import filler_text

    d = harness.start(model, home, "--backend", args.backend, timeout=600)
    pid0 = d.pid
    windows, reply_only, tokens = [], [], []
    try:
        with d.http(timeout=1800) as h:
            # the long prompt: about --tokens tokens
            text = filler_text(0, args.tokens * 2)  # ~2 characters a token with the presets' BPE
            t0 = time.perf_counter()
            r = harness.chat(h, "dw", [{"role": "user", "content": text}], max_tokens=args.max_tokens)
            print(f"prefill {r['usage']['prompt_tokens']} tokens in {time.perf_counter() - t0:.1f} s", flush=True)
            harness.wait_durable(h, "dw")
            for k in range(args.turns):
                _, engram, last = harness.stream_chat(h, "dw", f"Next question {k}: and then?", args.max_tokens)
                seen_reply = None
                deadline = time.monotonic() + 120
                while True:  # poll: when is the reply durable, when is every snapshot of the turn
                    snaps = harness.snapshots(h, "dw")
                    now = time.perf_counter()
                    reply = next(s for s in snaps if s["id"] == engram["snapshot_id"])
                    if reply["durable"] and seen_reply is None:
                        seen_reply = now
                    if all(s["durable"] for s in snaps):
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError("snapshots not durable in 120 s")
                    time.sleep(0.005)
                windows.append((now - last) * 1000)
                reply_only.append((seen_reply - last) * 1000)
                tokens.append(engram["prompt_tokens"] + engram["completion_tokens"])
                print(f"turn {k}: {tokens[-1]} tokens, all durable {windows[-1]:.0f} ms", flush=True)
            # the kill check: SIGKILL one second after the reply's last token
            _, engram, last = harness.stream_chat(h, "dw", "A last question before the crash?", args.max_tokens)
            killed_after = None
            time.sleep(max(0.0, 1.0 - (time.perf_counter() - last)))
            killed_after = time.perf_counter() - last
            os.kill(d.pid, 9)
            d.proc.wait(30)
        d = harness.start(model, home, "--backend", args.backend, timeout=600)
        with d.http(timeout=1800) as h:
            listed = {s["id"]: s for s in harness.snapshots(h, "dw")}
            survived = engram["snapshot_id"] in listed and listed[engram["snapshot_id"]]["durable"]
            restored = h.post("/restore_snapshot", json={"snapshot_id": engram["snapshot_id"]})
            restore_ok = restored.status_code == 200 and restored.json().get("token_count") == (
                engram["prompt_tokens"] + engram["completion_tokens"]
            )
        d.stop()
    finally:
        d.kill() if d.proc.poll() is None else None
    out = {
        "model": str(model),
        "backend": args.backend,
        "state_tokens": [min(tokens), max(tokens)],
        "turns": len(windows),
        "window_all_ms": {"p50": harness.percentile(windows, 50), "p99": harness.percentile(windows, 99)},
        "window_reply_ms": {"p50": harness.percentile(reply_only, 50), "p99": harness.percentile(reply_only, 99)},
        "windows_ms": [round(w, 1) for w in windows],
        "kill_after_s": round(killed_after, 3),
        "reply_snapshot_survived": survived,
        "restored": restore_ok,
        "first_pid": pid0,
        "cpu_s": round(harness.cpu_seconds() - cpu0, 1),
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0 if survived and restore_ok else 1


if __name__ == "__main__":
    sys.exit(main())
