"""The variants of `engramctl bench ngram` on the real engine: a bench preset model (engramctl.bench.presets,
random weights) served by the transformers backend, with the engine's own N-gram layer (engine/ngram_hooks.py).

  A  the preset model alone
  B  the same weights + one N-gram layer, its table file loaded into RAM (gathered at the layer)
  C  the same table file on disk, read synchronously when the N-gram layer runs
  D  on disk, the rows prefetched by the engine while the blocks before the N-gram layer compute

B, C and D are one model whose TableSet is swapped (NgramHooks.open_tables): the same bytes, so their
logits must be equal bitwise. `batch` sequences run one after the other (the engine serves batch 1): each
is prefilled in chunks of `chunk` tokens, then decodes `decode_tokens` given random tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from engramctl.bench.timing import Clock
from engramctl.bench.workloads.ngram_config import NgramBenchConfig, engram_config, rates


def _dtype(cfg: NgramBenchConfig) -> str:
    return "bfloat16" if cfg.device == "cuda" else "float32"


def _load(cfg: NgramBenchConfig, cache_dir: Path, note, **ngram):
    """The preset's backend through the one loader (the preset's model directory is built once, cached)."""
    from engramctl.bench.preset_dir import preset_dir
    from engramctl.bench.presets import preset_id
    from engramctl.engine.loading import load_engine

    model_dir = preset_dir(cfg.preset, cfg.seed, cache_dir, note)
    engine = load_engine(
        str(model_dir),
        cache_dir,
        cfg.device,
        _dtype(cfg),
        backend="transformers",
        model_id=preset_id(cfg.preset, cfg.seed),
        **ngram,
    )
    return engine.backend


def plain_backend(cfg: NgramBenchConfig, cache_dir: Path, note):
    """A: the preset model without N-gram layers."""
    return _load(cfg, cache_dir, note)


class EngineVariants:
    """Some of A/B/C/D over one table of about `table_bytes`, its files under `directory`."""

    def __init__(self, cfg: NgramBenchConfig, directory: Path, table_bytes: int, variants, plain, cache_dir, note):
        from engramctl.bench.presets import VOCAB
        from engramctl.ngram.tableset import TableSetup

        self.cfg, self.variants = cfg, tuple(variants)
        dtype = _dtype(cfg)
        row_bytes = cfg.head_dim * (2 if dtype == "bfloat16" else 4)
        ecfg = engram_config(cfg, table_bytes, row_bytes)

        def setup(tier: str, read: str) -> TableSetup:
            return TableSetup(
                directory, tier=tier, read=read, io_threads=cfg.io_threads, read_mode=cfg.read_mode, init="bits"
            )

        self.plain = plain
        first = "ram" if "B" in self.variants else "disk"
        with Clock() as c:  # the model's load, the table files' one write included
            self.engram = _load(cfg, cache_dir, note, ngram=ecfg, tables=setup(first, "prefetch"))
        self.load_s = c.sample.wall_s
        hooks = self.engram.engram
        self.sets = {"B": hooks.tables} if "B" in self.variants else {}
        for v, read in (("C", "sync"), ("D", "prefetch")):
            if v in self.variants:
                self.sets[v] = hooks.tables if first == "disk" and v == "D" else hooks.open_tables(setup("disk", read))
        spec = next(iter(hooks.tables.readers.values())).spec
        self.table = {"rows": spec.rows, "row_bytes": spec.row_bytes, "size_bytes": spec.size_bytes}
        rng = np.random.default_rng(cfg.seed)
        # ids the preset tokenizer knows (past it every id compresses to the pad, one n-gram)
        self.tokens = rng.integers(3, VOCAB, (cfg.batch, cfg.prefill_tokens + cfg.decode_tokens)).tolist()

    def run(self, variant: str) -> dict[str, Any]:
        import torch

        cfg = self.cfg
        backend = self.plain if variant == "A" else self.engram
        readers = []
        if variant != "A":
            tables = self.engram.engram.tables = self.sets[variant]
            readers = list(tables.readers.values())
            for r in readers:
                r.waited_ms = 0.0
                if not r.table.resident:
                    r.table.evict_page_cache()  # cold: every read goes to the device
        backend.chunk_tokens = cfg.chunk
        wall, cpu, logits = {"prefill": 0.0, "decode": 0.0}, 0.0, None
        for seq in self.tokens:
            live = backend.new_live()
            steps = [("prefill", seq[: cfg.prefill_tokens])] if cfg.prefill_tokens else []
            steps += [("decode", [t]) for t in seq[cfg.prefill_tokens :]]
            for phase, ids in steps:
                with Clock() as c:
                    logits = backend.prefill(live, ids) if phase == "prefill" else backend.decode(live, ids[0])
                    if cfg.device == "cuda":
                        torch.cuda.synchronize()
                wall[phase] += c.sample.wall_s
                cpu += c.sample.cpu_s
            backend.release(live)
        return {
            **rates(cfg, wall, cpu),
            "wait_ms": sum(r.waited_ms for r in readers) if readers else None,
            "unique_rows_per_step": None,
            "final": None if logits is None else logits.detach().cpu(),
        }

    def close(self) -> None:
        for tables in {id(t): t for t in self.sets.values()}.values():
            tables.close()
