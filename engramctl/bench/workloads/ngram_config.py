"""`engramctl bench ngram`'s configuration (the variants are described in workloads/ngram.py)."""

from __future__ import annotations

from dataclasses import dataclass

from engramctl.errors import UsageError

MiB = 1 << 20
GiB = 1 << 30
DISK_RESERVE_BYTES = 2 * GiB  # E never fills the disk past this
VARIANTS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class NgramBenchConfig:
    preset: str | None = "tiny"  # the bench preset model the engine serves (tiny, granite-4.0-h-350m)
    ngram_layer: int = 1  # the second block, as in the paper's offload experiment
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


def engram_config(cfg: NgramBenchConfig, table_bytes: int, row_bytes: int | None = None):
    """The paper-like Engram config whose one layer's table is about `table_bytes` (rows of `row_bytes`;
    default the table dtype's)."""
    from engramctl.ngram.hashing import NgramConfig

    per_head = max(2, table_bytes // (row_bytes or cfg.row_bytes) // cfg.columns)
    return NgramConfig(
        max_ngram_size=cfg.max_ngram_size,
        n_head_per_ngram=cfg.heads,
        n_embed_per_ngram=cfg.heads * cfg.head_dim,
        engram_vocab_size=[per_head] * (cfg.max_ngram_size - 1),
        layer_ids=[cfg.ngram_layer],
        pad_id=0,
        seed=cfg.seed,
    )


def rates(cfg: NgramBenchConfig, wall: dict[str, float], cpu_s: float) -> dict[str, float | None]:
    """A variant's throughput from its timed prefill and decode (wall seconds by phase), either backbone."""
    prefill_tok, decode_tok = cfg.batch * cfg.prefill_tokens, cfg.batch * cfg.decode_tokens
    total = wall["prefill"] + wall["decode"]
    return {
        "tokens_per_s": (prefill_tok + decode_tok) / total if total > 0 else None,
        "prefill_tokens_per_s": prefill_tok / wall["prefill"] if wall["prefill"] > 0 else None,
        "decode_tokens_per_s": decode_tok / wall["decode"] if wall["decode"] > 0 else None,
        "wall_s": total,
        "cpu_per_wall": cpu_s / total if total > 0 else None,
    }
