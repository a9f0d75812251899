"""The N-gram paper's Table 4 on a stand-in backbone: `engramctl bench ngram`'s variants (A-F,
engramctl/bench/workloads/ngram.py) run outside the engine, on a research stand-in model.

    .venv/bin/python scripts/ngram_standin.py [--quick] [--json] [--hidden 512] [--layers 8] [--runs 3] ...

`engramctl bench ngram` runs the same harness on the real engine; this script keeps the stand-in out of the
installed package. The backbone: embedding, `layers` pre-norm MLP blocks
(d -> 4d -> d, SiLU), a final norm and a vocabulary head; position-wise, so a step costs the same at any
context. The N-gram layer is engramctl.ngram.fusion.NgramFusion (one branch, the short conv with its
per-sequence state) fed by engramctl.ngram.hashing row ids, outside the engine. `batch` sequences run side
by side (one step = one chunk or one decoded token of each); the row ids come from the step's token ids and
the lookback (RowIds) before the backbone runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engramctl.bench.timing import Clock
from engramctl.bench.workloads.ngram_config import NgramBenchConfig, engram_config, rates
from engramctl.errors import UsageError


@dataclass(frozen=True)
class StandinConfig(NgramBenchConfig):
    """The harness's configuration plus the stand-in's shape."""

    preset: str | None = None
    hidden: int = 512
    layers: int = 8
    vocab: int = 32000  # random token ids in [0, vocab); identity compression

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.ngram_layer < self.layers:
            raise UsageError(f"the N-gram layer {self.ngram_layer} must be one of the {self.layers} blocks.")


def build_model(cfg: StandinConfig, memory_dim: int):
    import torch
    from torch import nn

    from engramctl.ngram.fusion import NgramFusion

    torch.manual_seed(cfg.seed)
    d = cfg.hidden

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.up, self.down = nn.RMSNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            return x + self.down(nn.functional.silu(self.up(self.norm(x))))

    model = nn.ModuleDict(
        {
            "embed": nn.Embedding(cfg.vocab, d),
            "blocks": nn.ModuleList(Block() for _ in range(cfg.layers)),
            "norm": nn.RMSNorm(d),
            "head": nn.Linear(d, cfg.vocab, bias=False),
            # the demo's module; a non-zero conv so the conv path really runs
            "engram": NgramFusion(memory_dim, d, branches=1, kernel_size=4, dilation=cfg.max_ngram_size),
        }
    )
    return model.to(cfg.device).eval()


class Runner:
    """Runs the token stream through the backbone in one variant and times it."""

    def __init__(self, cfg: StandinConfig, model, hasher, tokens: np.ndarray):
        self.cfg, self.model, self.hasher, self.tokens = cfg, model, hasher, tokens

    def steps(self) -> list[tuple[str, int, int]]:
        """(phase, start, end) over the token stream: prefill chunks, then one token per decode step."""
        cfg, out = self.cfg, []
        for a in range(0, cfg.prefill_tokens, cfg.chunk):
            out.append(("prefill", a, min(cfg.prefill_tokens, a + cfg.chunk)))
        for a in range(cfg.prefill_tokens, cfg.prefill_tokens + cfg.decode_tokens):
            out.append(("decode", a, a + 1))
        return out

    def run(self, variant: str, prefetcher=None) -> dict[str, Any]:
        import torch

        from engramctl.ngram.prefetch import RowIds

        cfg, m = self.cfg, self.model
        layer = cfg.ngram_layer
        plan = RowIds(self.hasher, batch=cfg.batch)
        wall = {"prefill": 0.0, "decode": 0.0}
        cpu = 0.0
        waits_ms: list[float] = []
        unique_rows: list[int] = []
        state, last = None, None
        with torch.inference_mode():
            for phase, a, b in self.steps():
                new = self.tokens[:, a:b]
                with Clock() as c:
                    pending = ids = None
                    if variant != "A":
                        ids = plan.step(new.tolist())[layer]  # hashed before the backbone runs
                        if variant == "D":
                            pending = prefetcher.submit(ids)
                    x = m["embed"](torch.from_numpy(new).to(cfg.device))
                    for i, block in enumerate(m["blocks"]):
                        if i == layer and variant != "A":
                            step = pending if pending is not None else prefetcher.submit(ids)
                            rows = step.wait()  # B, C: read here, at the layer; D: only what is not there yet
                            waits_ms.append(step.stats.wait_ms)
                            unique_rows.append(step.stats.unique_rows)
                            memory = torch.from_numpy(rows).to(cfg.device).reshape(new.shape[0], new.shape[1], -1)
                            h, state = m["engram"](x.unsqueeze(2), memory.float(), state)
                            x = h.squeeze(2)
                        x = block(x)
                    last = m["head"](m["norm"](x[:, -1]))
                    if cfg.device == "cuda":
                        torch.cuda.synchronize()
                wall[phase] += c.sample.wall_s
                cpu += c.sample.cpu_s
        return {
            **rates(cfg, wall, cpu),
            "wait_ms": sum(waits_ms),
            "unique_rows_per_step": statistics.mean(unique_rows) if unique_rows else None,
            "final": None if last is None else last.detach().cpu(),
        }


class StandinVariants:
    """Some of A/B/C/D on the stand-in backbone over one table of about `table_bytes`, written to
    `directory`; `model` shares one backbone between several tables (E)."""

    def __init__(self, cfg: StandinConfig, directory: Path, table_bytes: int, variants, model=None):
        from engramctl.ngram.hashing import NgramHasher
        from engramctl.ngram.prefetch import Prefetcher
        from engramctl.ngram.table_file import write_table
        from engramctl.ngram.table_read import open_table
        from engramctl.ngram.table_spec import TableSpec, config_hash

        self.cfg = cfg
        ecfg = engram_config(cfg, table_bytes)
        hasher = NgramHasher(ecfg, cfg.vocab)
        layer = cfg.ngram_layer
        spec = TableSpec(
            layer, hasher.rows(layer), cfg.head_dim, cfg.table_dtype, cfg.seed, "bits", config_hash(ecfg, cfg.vocab)
        )
        with Clock() as c:
            write_table(directory, spec)
        self.load_s = c.sample.wall_s
        self.table = {"rows": spec.rows, "row_bytes": spec.row_bytes, "size_bytes": spec.size_bytes}
        self.disk = open_table(directory, layer, expect=spec, read_mode=cfg.read_mode)
        rng = np.random.default_rng(cfg.seed)
        tokens = rng.integers(0, cfg.vocab, (cfg.batch, cfg.prefill_tokens + cfg.decode_tokens))
        self.model = model if model is not None else build_model(cfg, ecfg.memory_dim)
        self.runner = Runner(cfg, self.model, hasher, tokens)
        self.prefetchers: dict[str, Any] = {"A": None}
        if "B" in variants:  # RAM: a gather at the layer (np.take)
            self.prefetchers["B"] = Prefetcher(self.disk.load_resident(), threads=0)
        for v in ("C", "D"):  # the same gather threads; C starts them at the layer, D before the backbone
            if v in variants:
                self.prefetchers[v] = Prefetcher(self.disk, threads=cfg.io_threads)

    def run(self, variant: str) -> dict[str, Any]:
        if variant in ("C", "D"):
            self.disk.evict_page_cache()  # cold: every read goes to the device
        return self.runner.run(variant, self.prefetchers[variant])

    def close(self) -> None:
        for p in self.prefetchers.values():
            if p is not None:
                p.close()
        self.disk.close()


def maker(cfg: StandinConfig):
    """(make, description) for the harness (workloads/ngram.run): one backbone shared by every table."""
    shared: dict[str, Any] = {}

    def make(directory, size, variants):
        made = StandinVariants(cfg, directory, size, variants, model=shared.get("model"))
        shared.setdefault("model", made.model)
        return made

    return make, (
        f"stand-in: embedding, {cfg.layers} pre-norm MLP blocks of width {cfg.hidden}, vocabulary head "
        f"{cfg.vocab}; Engram (engramctl.ngram.fusion.NgramFusion, 1 branch, short conv) before block "
        f"{cfg.ngram_layer}"
    )


class _Progress:
    def phase(self, key: str, description: str, total: int) -> None:
        print(f"{description}...", file=sys.stderr)

    def advance(self, key: str, description: str | None = None) -> None: ...

    def note(self, text: str) -> None:
        print(text, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    from engramctl.bench.workloads.ngram import bench
    from engramctl.settings import load_settings
    from engramctl.units import parse_bytes

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small tables (1-4 MiB), few tokens, 1 run")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the tables")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--ngram-layer", type=int, default=1)
    p.add_argument("--runs", type=int, default=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prefill-tokens", type=int, default=None)
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=None)
    p.add_argument("--table-bytes", default=None)
    p.add_argument("--sizes", default=None, help="comma-separated table sizes of E")
    p.add_argument("--corpus-tokens", type=int, default=None)
    p.add_argument("--io-threads", type=int, default=4)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    q = a.quick
    sizes = a.sizes or ("1MiB,4MiB" if q else "64MiB,256MiB,1GiB")
    cfg = StandinConfig(
        hidden=a.hidden,
        layers=a.layers,
        ngram_layer=a.ngram_layer,
        runs=a.runs or (1 if q else 3),
        batch=a.batch,
        prefill_tokens=a.prefill_tokens if a.prefill_tokens is not None else (16 if q else 256),
        chunk=a.chunk,
        decode_tokens=a.decode_tokens or (4 if q else 32),
        table_bytes=parse_bytes(a.table_bytes or ("2MiB" if q else "256MiB"), "--table-bytes"),
        sizes=tuple(sorted({parse_bytes(x.strip(), "--sizes") for x in sizes.split(",") if x.strip()})),
        corpus_tokens=a.corpus_tokens or (2000 if q else 50_000),
        io_threads=a.io_threads,
        threads=a.threads,
        seed=a.seed,
        command="scripts/ngram_standin.py " + " ".join(sys.argv[1:] if argv is None else argv),
    )
    cfg.validate()
    result = bench(cfg, load_settings(), _Progress(), maker=maker(cfg))
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        from engramctl.cli.bench_ngram_report import render

        print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
