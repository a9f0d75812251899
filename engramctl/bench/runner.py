"""Runs the workloads in order and assembles the one JSON object the report prints.

    result = run_bench(BenchConfig(...), settings, progress)

Everything runs in this process on the same engine and store code the daemon uses ("mode":
"in-process"). The store lives in a fresh directory under the settings' data dir (so ENGRAM_HOME and
the config file are honoured, the disk measured is the data dir's disk, and the user's own snapshots
are never touched); it is deleted at the end unless keep_data is set. The parts: config.py (what runs),
model.py (what is measured), machine.py (where), workloads/ (the measurements), targets.py (against what).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from engramctl.bench.config import BenchConfig, Progress
from engramctl.bench.machine import describe_machine
from engramctl.bench.memory import resident_weight_bytes
from engramctl.bench.model import describe_model, load_model
from engramctl.bench.targets import efficiency, targets
from engramctl.bench.timing import LoadMeter, machine_load, wait_idle
from engramctl.errors import UsageError

SCHEMA = "engramctl-bench/1"


class StoreBox:
    """The bench's Store and the tier plan it keeps within (the bench's, as the daemon's is the daemon's),
    which the disk-restore measurement closes and reopens (a fresh process's view)."""

    def __init__(self, settings) -> None:
        self._settings = settings
        self.store, self.tiers = self._open()

    def _open(self):
        from engramctl.store.store import Store
        from engramctl.tiers.planner import TierPlanner

        store = Store.open(self._settings)
        return store, TierPlanner.start(self._settings, store.retention)

    def reopen(self):
        self.store.close()
        self.store, self.tiers = self._open()
        return self.store

    def close(self) -> None:
        self.store.close()


def _warm_up(engine) -> None:
    """Not counted: first calls allocate, load kernels and fill caches."""
    from engramctl.bench.material import filler_ids
    from engramctl.engine.sampling import SamplingParams

    live = engine.new_live()
    engine.prefill(live, filler_ids(engine.tokenizer, 64, 99))
    live2 = engine.inject(engine.capture(live))
    for _ in engine.generate(live2, SamplingParams(temperature=0.0, max_tokens=4)):
        pass
    engine.release(live)
    engine.release(live2)


def run_bench(cfg: BenchConfig, settings, progress: Progress | None = None) -> dict[str, Any]:
    import torch

    from engramctl.bench.workloads import bandwidth, constrained, contexts, multiturn, save, speed

    cfg.validate()
    progress = progress or Progress()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    load_before = machine_load()
    if cfg.wait_idle_s > 0 and not load_before["idle"]:
        progress.note(
            f"waiting up to {cfg.wait_idle_s:.0f} s for the machine to be idle "
            f"(other processes use {load_before['other_processes_cores']} cores)"
        )
        load_before = wait_idle(cfg.wait_idle_s)
    if not load_before["idle"]:
        progress.note(
            f"Warning: other processes use {load_before['other_processes_cores']} cores; "
            "timings will be slower and noisier than on an idle machine"
        )
    started = time.time()
    progress.phase("load", "loading model", 1)
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    loaded = load_model(cfg, settings, progress.note)
    engine = loaded.engine
    load_s = time.perf_counter() - t0
    progress.advance("load")
    limit = engine.info.context_length
    if cfg.contexts and limit is not None and max(cfg.contexts) + cfg.message_tokens + 1 > limit:
        raise UsageError(
            f"context {max(cfg.contexts)} + a {cfg.message_tokens}-token message does not fit the "
            f"model's context of {limit} tokens.",
            hint="pass smaller --contexts",
        )
    multiturn_skip = None
    if cfg.turns and not engine.tokenizer.has_chat_template:
        multiturn_skip = "the model has no chat template"

    data_root = settings.paths.data_dir
    data_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    bench_dir = Path(tempfile.mkdtemp(prefix="bench-", dir=data_root))
    bench_settings = dataclasses.replace(settings, paths=settings.paths._replace(data_dir=bench_dir))
    box = StoreBox(bench_settings)
    during: dict[str, dict] = {}  # phase -> cores other processes used while it ran
    try:
        _warm_up(engine)
        resident = resident_weight_bytes(engine, loaded.gguf)  # after the warm-up touched every weight
        plan = box.tiers.plan_json()
        progress.phase("bandwidth", "bandwidth floor", 2)
        with LoadMeter() as m:  # the restore targets divide by this floor: a disturbed one shows here
            bw = bandwidth.measure(
                bench_dir, cfg.memcpy_bytes, cfg.disk_bytes, cfg.runs, step=lambda: progress.advance("bandwidth")
            )
        during["bandwidth"] = m.result
        with LoadMeter() as m:  # milliseconds: always run
            structured = constrained.measure(engine, cfg.runs)
        during["constrained"] = m.result
        sp = None
        if cfg.prefill_tokens:
            with LoadMeter() as m:
                sp = speed.measure(cfg, settings, loaded, progress)
            during["speed"] = m.result
        rows: list[dict[str, Any]] = []
        if cfg.contexts:
            progress.phase("contexts", "context sweep", 1 + cfg.runs * len(cfg.contexts))
            with LoadMeter() as m:
                rows = contexts.run(
                    engine,
                    box,
                    list(cfg.contexts),
                    cfg.runs,
                    cfg.seed,
                    cfg.message_tokens,
                    step=lambda d: progress.advance("contexts", d),
                )
            during["contexts"] = m.result
            for row in rows:
                efficiency(row, bw)
            at = next((r for r in rows if r["tokens"] == 2048), None)
            if at is not None:
                bw["one_memcpy_at_2048_ms"] = round(bandwidth.one_memcpy_ms(at["state_bytes"], cfg.runs), 3)
        mt: dict[str, Any] | None = None
        save_summary: dict[str, Any] = {"snapshots": 0}
        if cfg.turns and multiturn_skip is None:
            progress.phase("multiturn", "multi-turn chat", cfg.turns)
            with LoadMeter() as m:
                raw = multiturn.run(
                    engine, box, cfg.turns, cfg.reply_tokens, step=lambda d: progress.advance("multiturn", d)
                )
            during["multiturn"] = m.result
            mt = multiturn.summarize(raw, cfg.turns, cfg.reply_tokens)
            save_summary = save.summarize(raw["rows"])
    finally:
        box.close()
        if not cfg.keep_data:
            shutil.rmtree(bench_dir, ignore_errors=True)
    load_after = machine_load(0.5)
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "command": cfg.command,
        "mode": "in-process",
        "duration_s": round(time.time() - started, 1),
        "machine": {
            **describe_machine(engine.info.device),
            "load_before": load_before,
            "load_after": load_after,
            "load_during": during,
        },
        "model": describe_model(engine, cfg, loaded, load_s, resident),
        "settings": {
            "contexts": list(cfg.contexts),
            "turns": cfg.turns,
            "runs": cfg.runs,
            "warmup_runs": 1,
            "reply_tokens": cfg.reply_tokens,
            "message_tokens": cfg.message_tokens,
            "seed": cfg.seed,
            "quick": cfg.quick,
            "sampling": "greedy",
            "data_dir": str(bench_dir),
            "data_kept": cfg.keep_data,
            "backend": cfg.backend,
            "gguf_type": cfg.gguf_type if loaded.gguf else None,
            "prefill_tokens": cfg.prefill_tokens,
            "decode_tokens": cfg.decode_tokens,
        },
        "tiers": {t["name"]: {"budget_bytes": t["budget_bytes"], "rule": t["rule"]} for t in plan["tiers"]},
        "bandwidth": bw,
        "contexts": rows,
        "multiturn": mt
        if mt is not None
        else {
            "turns": 0,
            "prompt_tokens_sent": 0,
            "prompt_tokens_computed": {"stateful": 0, "stateless": 0},
            "token_reduction": None,
            "skipped": multiturn_skip or "--turns 0",
        },
        "save": save_summary,
        "speed": sp,
        "constrained": structured,
        "targets": targets(rows, mt, sp, bw),
    }
