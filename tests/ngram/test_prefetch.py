"""Prefetch invariants (spec §4.5): the row ids prefetched step by step equal a reference hash of the whole
sequence across prefill, chunked prefill, decode and resume; the rows gathered equal T[ids]; and the Engram
output with the table on disk (prefetched or read at the layer, with or without a RAM row cache) equals the
output with it resident, bitwise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engramctl.errors import UsageError
from engramctl.ngram.fusion import NgramFusion
from engramctl.ngram.hashing import NgramConfig, NgramHasher
from engramctl.ngram.prefetch import Prefetcher, RowCache, RowIds
from engramctl.ngram.table_file import write_table
from engramctl.ngram.table_read import ResidentTable, open_table
from engramctl.ngram.table_spec import TableSpec

CFG = NgramConfig(
    max_ngram_size=3, n_head_per_ngram=2, n_embed_per_ngram=16, engram_vocab_size=[97, 89], layer_ids=[1, 3], pad_id=0
)
VOCAB = 40


@pytest.fixture(scope="module")
def hasher() -> NgramHasher:
    return NgramHasher(CFG, VOCAB)


def _tokens(batch: int, t: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, t))


def _reference(hasher: NgramHasher, tokens: np.ndarray) -> dict[int, np.ndarray]:
    return {layer: ids + hasher.offsets(layer) for layer, ids in hasher.hash(tokens.tolist()).items()}


def _steps(plan: RowIds, tokens: np.ndarray, cuts: list[int]) -> dict[int, np.ndarray]:
    parts: dict[int, list[np.ndarray]] = {layer: [] for layer in CFG.layer_ids}
    for a, b in zip([0, *cuts], [*cuts, tokens.shape[1]]):
        for layer, ids in plan.step(tokens[:, a:b].tolist()).items():
            parts[layer].append(ids)
    return {layer: np.concatenate(p, axis=1) for layer, p in parts.items()}


@pytest.mark.parametrize(
    "cuts",
    [
        [],  # one prefill
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],  # decode from the first token
        [7, 8, 13],  # chunked prefill (chunks shorter and longer than the lookback)
        [12] + list(range(13, 20)),  # prefill, then decode
    ],
)
def test_prefetched_ids_equal_a_reference_hash_of_the_whole_sequence(hasher, cuts):
    tokens = _tokens(3, 20)
    want = _reference(hasher, tokens)
    got = _steps(RowIds(hasher, batch=3), tokens, cuts)
    for layer in CFG.layer_ids:
        assert got[layer].dtype == np.int64
        assert np.array_equal(got[layer], want[layer])
        assert got[layer].max() < hasher.rows(layer)


def test_resume_from_a_saved_lookback_continues_the_same_ids(hasher):
    tokens = _tokens(2, 16, seed=1)
    want = _reference(hasher, tokens)
    first = RowIds(hasher, batch=2)
    before = _steps(first, tokens[:, :9], [4])
    saved = first.to_list()  # what a snapshot keeps: the last N-1 ids of each sequence
    assert saved == tokens[:, 7:9].tolist()
    resumed = RowIds(hasher, lookback=saved)  # a fresh process
    after = _steps(resumed, tokens[:, 9:], [1, 2, 3])
    for layer in CFG.layer_ids:
        assert np.array_equal(np.concatenate([before[layer], after[layer]], axis=1), want[layer])


def test_short_sequences_keep_a_short_lookback(hasher):
    plan = RowIds(hasher, batch=1)
    plan.step([[5]])
    assert plan.to_list() == [[5]]
    plan.step([[6, 7, 8]])
    assert plan.to_list() == [[7, 8]]


@pytest.fixture(scope="module")
def tables(hasher, tmp_path_factory):
    """Layer 1's table resident and on disk, same bytes."""
    spec = TableSpec(layer_id=1, rows=hasher.rows(1), dim=CFG.head_dim, dtype="float32", seed=5, config_hash="t")
    directory = tmp_path_factory.mktemp("tables")
    write_table(directory, spec, threads=1)
    return spec, ResidentTable.generate(spec), directory


@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("read_mode", ["pread", "mmap"])
def test_rows_equal_the_table_at_the_ids(hasher, tables, threads, read_mode):
    spec, resident, directory = tables
    ids = RowIds(hasher, batch=2).step(_tokens(2, 50, seed=2).tolist())[1]
    want = resident.array[ids]  # (2, 50, 4, D_h)
    with open_table(directory, 1, expect=spec, read_mode=read_mode) as disk:
        for source in (resident, disk):
            with Prefetcher(source, threads=threads, chunk_rows=16) as pre:
                pending = pre.submit(ids)
                got = pending.wait()
                assert got.shape == (2, 50, 4, CFG.head_dim) and got.tobytes() == want.tobytes()
                assert pending.stats.rows == ids.size and pending.stats.unique_rows == len(np.unique(ids))
                assert pre.fetch(ids).tobytes() == want.tobytes()


def test_row_cache_serves_repeats_and_evicts_least_recent(tables):
    spec, resident, directory = tables
    cache = RowCache(4, spec.dim, spec.storage_dtype)
    with open_table(directory, 1, expect=spec) as disk, Prefetcher(disk, threads=0, cache=cache) as pre:
        for ids in ([1, 2, 3], [2, 3, 4], [5, 6], [1, 2]):
            got = pre.fetch(np.array(ids))
            assert got.tobytes() == resident.array[ids].tobytes()
    # [1,2,3] miss 3; [2,3,4] hit 2 miss 1; [5,6] miss 2 (evicts 1, 2); [1,2] miss 2
    assert (cache.hits, cache.misses) == (2, 8)
    assert len(cache) == 4


def test_a_slot_reused_before_its_rows_were_taken_is_refused(tables):
    _, resident, _ = tables
    with Prefetcher(resident, threads=1) as pre:
        first = pre.submit(np.array([1, 2]))
        pre.submit(np.array([3]))
        pre.submit(np.array([4]))  # reuses the first step's staging slot
        with pytest.raises(UsageError, match="reused"):
            first.wait()


def test_a_read_error_reaches_the_layer(tables):
    _, resident, _ = tables
    with Prefetcher(resident, threads=2) as pre:
        with pytest.raises(UsageError, match="row ids"):
            pre.submit(np.array([resident.spec.rows + 1])).wait()


def test_engram_output_with_the_table_on_disk_equals_it_resident_bitwise(hasher, tables):
    """A short run through the fusion, step by step: resident table vs disk (prefetched, synchronous, cached)."""
    spec, resident, directory = tables
    torch.manual_seed(0)
    d = 32
    fusion = NgramFusion(CFG.memory_dim, d, branches=1, kernel_size=CFG.kernel_size, dilation=CFG.max_ngram_size)
    tokens = _tokens(2, 12, seed=3)
    hidden = torch.randn(2, 12, 1, d)
    cuts = [5, 6, 7, 8]

    def run(source, prefetch: bool, cache: RowCache | None = None) -> torch.Tensor:
        plan, state, outs = RowIds(hasher, batch=2), None, []
        with Prefetcher(source, threads=2 if prefetch else 0, cache=cache, chunk_rows=8) as pre:
            for a, b in zip([0, *cuts], [*cuts, 12]):
                ids = plan.step(tokens[:, a:b].tolist())[1]
                pending = pre.submit(ids) if prefetch else None
                rows = pending.wait() if prefetch else pre.fetch(ids)
                memory = torch.from_numpy(rows).reshape(2, b - a, -1)
                out, state = fusion(hidden[:, a:b], memory, state)
                outs.append(out)
        return torch.cat(outs, dim=1)

    with torch.no_grad():
        want = run(resident, prefetch=False)
        with open_table(directory, 1, expect=spec) as disk:
            for got in (
                run(disk, prefetch=True),
                run(disk, prefetch=False),
                run(disk, prefetch=True, cache=RowCache(64, spec.dim, spec.storage_dtype)),
            ):
                assert torch.equal(got, want)
