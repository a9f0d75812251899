"""E of `engramctl bench ngram`: D (and A, for the ratio) at each table size, each table written, measured
and deleted in turn, so the disk holds one at a time."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

from engramctl.bench.workloads.ngram_config import DISK_RESERVE_BYTES, GiB, NgramBenchConfig
from engramctl.bench.workloads.ngram_summary import ratio, summary
from engramctl.errors import NgramTableError


def table_sizes(cfg: NgramBenchConfig, work_dir: Path, hw, tier_plan, make: Callable, progress) -> list[dict[str, Any]]:
    """`make(directory, table_bytes, variants)` builds the variants over a table of that size (its files
    under directory); one row per size of cfg.sizes."""
    from engramctl.tiers.plan import TierBudget, TierPlan, claim_tables

    rows_out = []
    progress.phase("sizes", "E: table sizes", len(cfg.sizes))
    for size in cfg.sizes:
        entry: dict[str, Any] = {"requested_bytes": size}
        free = shutil.disk_usage(work_dir).free
        # the bench's disk budget: what is free less a reserve (the snapshot tier's 20 GiB cap is not the limit
        # here: the run deletes each table before writing the next)
        disk_room = TierPlan(
            tier_plan.hardware,
            tuple(
                t
                if t.name != "disk"
                else TierBudget("disk", max(0, free - DISK_RESERVE_BYTES), free, "bench: free disk - 2 GiB", None)
                for t in tier_plan.tiers
            ),
        )
        try:
            claim_tables(disk_room, [(f"layer-{cfg.ngram_layer}", size)], tier="disk")
        except NgramTableError:
            entry.update(size_bytes=size, x_free_ram=round(size / hw.ram_available_bytes, 3))
            entry["skipped"] = (
                f"does not fit the disk ({free / GiB:.1f} GiB free, {DISK_RESERVE_BYTES // GiB} GiB kept)"
            )
            rows_out.append(entry)
            progress.advance("sizes")
            continue
        directory = work_dir / f"size-{size}"
        samples: dict[str, list[dict]] = {"A": [], "D": []}
        variants = None
        try:
            variants = make(directory, size, ("A", "D"))
            table = variants.table
            entry.update(
                size_bytes=table["size_bytes"],
                x_free_ram=round(table["size_bytes"] / hw.ram_available_bytes, 3),
                x_ram_budget=round(table["size_bytes"] / max(1, tier_plan.budget("ram")), 3),
                load_s=round(variants.load_s, 2),  # the table written once (and, engine, the model built)
            )
            for r in range(cfg.runs + 1):  # run 0 warms up and is not counted
                for v in ("A", "D") if r % 2 == 0 else ("D", "A"):
                    s = variants.run(v)
                    s.pop("final")
                    if r:
                        samples[v].append(s)
        finally:
            if variants is not None:
                variants.close()
            shutil.rmtree(directory, ignore_errors=True)
        a, d = summary(samples["A"]), summary(samples["D"])
        entry.update(
            {
                "tokens_per_s": d["tokens_per_s"],
                "spread_tokens_per_s": d["spread_tokens_per_s"],
                "a_tokens_per_s": a["tokens_per_s"],
                "slowdown_vs_a": ratio(d["tokens_per_s"], a["tokens_per_s"]),
                "wait_ms": d["wait_ms"],
                "cpu_per_wall": d["cpu_per_wall"],
            }
        )
        rows_out.append(entry)
        progress.advance("sizes")
    return rows_out
