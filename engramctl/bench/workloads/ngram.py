"""`engramctl bench ngram`: the shape of the Engram paper's Table 4 on this machine (spec §5).

Tokens/s interleaved over `runs` repeats (median), seeded, CPU/wall recorded:
  A  the backbone alone
  B  + one N-gram layer at block `ngram_layer`, its table resident in RAM (gathered at the layer)
  C  the table on disk, every row read synchronously at the N-gram layer
  D  the table on disk, rows prefetched by gather threads while the embedding and the blocks before the
     N-gram layer compute (engramctl.ngram.prefetch)
  E  D across table sizes (the flag --sizes), each table written, measured, deleted in turn (ngram_sizes.py)
  F  real text: hit rate of an LRU RAM cache of disk rows against cache size, per n-gram order, and the
     unique rows per step (ngram_text.py)

The backbone: the real engine serving a bench preset model (ngram_engine.py: the transformers backend with
the engine's own N-gram layer and table files). The research harness scripts/ngram_standin.py runs the same
variants on a stand-in MLP backbone outside the engine. Token ids are random (the paper's worst case for caching).

Cold reads: before every measured C/D/E run the table's pages are dropped from the page cache with
posix_fadvise(DONTNEED) (no root needed), or, with read_mode "direct", every read is an
O_DIRECT read. Correctness, not speed, is also checked: the final outputs of C and D equal B's bitwise.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from engramctl.bench.timing import LoadMeter
from engramctl.bench.workloads.ngram_config import MiB, VARIANTS, NgramBenchConfig
from engramctl.bench.workloads.ngram_sizes import table_sizes
from engramctl.bench.workloads.ngram_summary import above, at_most, ratio, summary
from engramctl.bench.workloads.ngram_text import real_text

SCHEMA = "engramctl-bench-ngram/1"


def engine_maker(cfg: NgramBenchConfig, cache_dir: Path, note: Callable[[str], None]) -> tuple[Callable, str]:
    """make(directory, table_bytes, variants) on the engine serving cfg.preset (one A backbone shared by
    every table), and the backbone's description."""
    from engramctl.bench.presets import PRESETS, preset_name
    from engramctl.bench.workloads.ngram_engine import EngineVariants, plain_backend

    plain = plain_backend(cfg, cache_dir, note)

    def make(directory, size, variants):
        return EngineVariants(cfg, directory, size, variants, plain, cache_dir, note)

    key = preset_name(cfg.preset)
    return make, (
        f"engine: transformers backend, preset {key} ({PRESETS[key].description}); the engine's N-gram layer "
        f"before block {cfg.ngram_layer}, table files read through its TableSet"
    )


def run(cfg: NgramBenchConfig, work_dir: Path, progress, note: Callable[[str], None], maker) -> dict[str, Any]:
    """The variants on the backbone `maker` = (make, description) gives (engine_maker; scripts/ngram_standin.py
    passes its stand-in's)."""
    import torch

    from engramctl.tiers.hardware import detect_hardware
    from engramctl.tiers.plan import claim_tables, plan

    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    hw = detect_hardware(work_dir)
    tier_plan = plan(hw)
    make, backbone = maker
    out: dict[str, Any] = {
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("command", "keep_data")},
        "hardware": {
            "ram_available_bytes": hw.ram_available_bytes,
            "ram_budget_bytes": tier_plan.budget("ram"),
            "disk_free_bytes": hw.disk_free_bytes,
            "torch_threads": torch.get_num_threads(),
        },
        "backbone": backbone,
        "cold_reads": "O_DIRECT" if cfg.read_mode == "direct" else "posix_fadvise(DONTNEED) before every run",
    }

    # B/C/D: one table, written to disk; the planner would place it (reported), B holds it in RAM, C/D on disk
    progress.phase("write", "writing the table", 1)
    table_dir = work_dir / "main"
    variants = make(table_dir, cfg.table_bytes, VARIANTS)
    progress.advance("write")
    size = variants.table["size_bytes"]
    placed = claim_tables(tier_plan, [(f"layer-{cfg.ngram_layer} ({size / MiB:.0f} MiB)", size)])
    out["table"] = {
        **variants.table,
        "planner_tier": placed.tables[0].tier,
        "rows_per_token": cfg.columns,
        "load_s": round(variants.load_s, 2),  # writing the table (on the engine: building the model too)
    }
    samples: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    finals: dict[str, Any] = {}
    progress.phase("abcd", "A/B/C/D", cfg.runs + 1)
    try:
        with LoadMeter() as meter:
            for r in range(cfg.runs + 1):  # run 0 warms up and is not counted
                order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))  # interleaved, ABCD DCBA
                for v in order:
                    s = variants.run(v)
                    finals.setdefault(v, s.pop("final"))
                    if r:
                        samples[v].append(s)
                progress.advance("abcd")
    finally:
        variants.close()
        if not cfg.keep_data:
            shutil.rmtree(table_dir, ignore_errors=True)
    summaries = {v: summary(samples[v]) for v in VARIANTS}
    a, b = summaries["A"]["tokens_per_s"], summaries["B"]["tokens_per_s"]
    for v, s in summaries.items():
        s["slowdown_vs_a"] = ratio(s["tokens_per_s"], a)
        s["slowdown_vs_b"] = ratio(s["tokens_per_s"], b) if v != "A" else None
    out["variants"] = summaries
    out["exact"] = {
        "c_equals_b": bool(torch.equal(finals["C"], finals["B"])),
        "d_equals_b": bool(torch.equal(finals["D"], finals["B"])),
    }
    out["load_during"] = meter.result
    out["sizes"] = table_sizes(cfg, work_dir, hw, tier_plan, make, progress)
    out["real_text"] = real_text(cfg, progress, note)
    out["targets"] = _targets(summaries, out["sizes"], out["exact"])
    return out


def _targets(variants: dict, sizes: list[dict], exact: dict) -> dict[str, Any]:
    d = variants["D"]
    flat = [s["tokens_per_s"] for s in sizes if s.get("tokens_per_s")]
    c_vs_d = ratio(variants["C"]["tokens_per_s"], d["tokens_per_s"])
    return {
        "d_within_1.05x_of_b": {"value": d["slowdown_vs_b"], "target": 1.05, "met": at_most(d["slowdown_vs_b"], 1.05)},
        "c_clearly_worse_than_d": {
            "value": c_vs_d,
            "target": "> 1.10 (C at least 10% slower than D)",
            "met": above(c_vs_d, 1.10),
        },
        "d_flat_across_sizes": {
            "value": round(max(flat) / min(flat), 4) if len(flat) > 1 else None,
            "target": "max/min tokens/s across sizes <= 1.05 (noise)",
            "met": (max(flat) / min(flat) <= 1.05) if len(flat) > 1 else None,
        },
        "exact": exact["c_equals_b"] and exact["d_equals_b"],
    }


def bench(cfg: NgramBenchConfig, settings, progress, maker=None) -> dict[str, Any]:
    """The whole run in a fresh bench-ngram-* directory under the data dir (deleted after unless keep_data);
    `maker`: the backbone (default: the engine serving cfg.preset, engine_maker)."""
    import platform
    import tempfile

    import torch

    from engramctl.bench.timing import machine_load
    from engramctl.tiers.hardware import cpu_model

    cfg.validate()
    root = settings.paths.data_dir
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    work = Path(tempfile.mkdtemp(prefix="bench-ngram-", dir=root))
    started = time.time()
    load_before = machine_load()
    if not load_before["idle"]:
        progress.note(
            f"Warning: other processes use {load_before['other_processes_cores']} cores; "
            "timings will be slower and noisier than on an idle machine"
        )
    try:
        made = maker or engine_maker(cfg, settings.paths.cache_dir, progress.note)
        result = run(cfg, work, progress, progress.note, made)
    finally:
        if not cfg.keep_data:
            shutil.rmtree(work, ignore_errors=True)
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "command": cfg.command,
        "duration_s": round(time.time() - started, 1),
        "machine": {
            "cpu": cpu_model(),
            "cpu_threads": os.cpu_count(),
            "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "device": cfg.device,
            "load_before": load_before,
        },
        "data_dir": None if not cfg.keep_data else str(work),
        **result,
    }
