"""The hash reproduces the demo's constants (spec Appendix A) and a reference written from the spec's
pseudo-code (§2.10); hashing only new positions with a lookback equals hashing the whole sequence."""

from __future__ import annotations

import numpy as np
import pytest

from engramctl.errors import UsageError
from engramctl.ngram.hashing import NgramConfig, NgramHasher
from engramctl.ngram.primes import is_prime, next_prime

DEMO_PRIMES = {
    (1, 2): [646403, 646411, 646421, 646423, 646433, 646453, 646519, 646523],
    (1, 3): [646537, 646543, 646549, 646571, 646573, 646577, 646609, 646619],
    (15, 2): [646631, 646637, 646643, 646669, 646687, 646721, 646757, 646771],
    (15, 3): [646781, 646823, 646831, 646837, 646843, 646859, 646873, 646879],
}


def test_demo_config_gives_the_published_prime_tables_and_row_counts():
    cfg = NgramConfig()  # the demo's defaults
    assert (cfg.max_ngram_size, cfg.n_head_per_ngram, cfg.n_embed_per_ngram) == (3, 8, 512)
    assert (list(cfg.engram_vocab_size), list(cfg.layer_ids), cfg.pad_id, cfg.seed, cfg.kernel_size) == (
        [646400, 646400],
        [1, 15],
        2,
        0,
        4,
    )
    h = NgramHasher(cfg, 129280)
    for layer in (1, 15):
        assert h.primes(layer).tolist() == DEMO_PRIMES[layer, 2] + DEMO_PRIMES[layer, 3]
    assert [h.rows(1), h.rows(15)] == [10_344_164, 10_348_242]


def test_deepseek_v41_row_counts_and_multipliers():
    cfg = NgramConfig(
        max_ngram_size=4, n_embed_per_ngram=8 * 256, engram_vocab_size=[16_000_000] * 3, layer_ids=[1, 14]
    )
    h = NgramHasher(cfg, 99_092)
    assert [h.rows(1), h.rows(14)] == [384_006_168, 384_016_682]
    # spec Appendix A, half = 46,539,438,283,891 for V' = 99,092
    assert h.multipliers(1).tolist() == [76632096046245, 4839876093313, 35959672319349, 73987337458391]
    assert h.multipliers(14).tolist() == [67716810739261, 51510806800915, 30921347202721, 82619226485591]


def test_paper_27b_row_counts():
    cfg = NgramConfig(n_embed_per_ngram=8 * 80, engram_vocab_size=[2_262_400] * 2, layer_ids=[1, 14])
    h = NgramHasher(cfg, 128_000)
    assert h.primes(1)[:3].tolist() == [2262409, 2262413, 2262437]
    assert h.primes(1)[8:11].tolist() == [2262499, 2262521, 2262529]
    assert [h.rows(1), h.rows(14)] == [36_199_972, 36_204_260]


def test_prime_search_against_trial_division():
    def slow(n):
        return n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))

    assert [n for n in range(3000) if is_prime(n)] == [n for n in range(3000) if slow(n)]
    assert is_prime(2**61 - 1) and not is_prime(2**61 + 1) and not is_prime(3215031751)  # a strong pseudoprime
    assert next_prime(646400, set()) == 646403 and next_prime(646400, {646403}) == 646411


def test_offsets_rows_and_multipliers_are_consistent():
    cfg = NgramConfig(
        max_ngram_size=4, n_head_per_ngram=3, n_embed_per_ngram=12, engram_vocab_size=[50, 60, 70], layer_ids=[0, 2]
    )
    h = NgramHasher(cfg, 40)
    primes = np.concatenate([h.primes(0), h.primes(2)])
    assert len(set(primes.tolist())) == len(primes) == 18 and all(is_prime(int(p)) for p in primes)
    for layer in (0, 2):
        p, off = h.primes(layer), h.offsets(layer)
        assert off.tolist() == [0] + np.cumsum(p)[:-1].tolist() and h.rows(layer) == int(p.sum())
        m = h.multipliers(layer)
        assert len(m) == 4 and (m % 2 == 1).all() and int(m.max()) * 39 < 2**63
    # order 3's heads start above order 2's, which start at M0
    assert h.primes(0)[0] > 50 and h.primes(0)[3] > 60 and h.primes(0)[6] > 70


def reference_row_ids(x: list[int], hasher: NgramHasher, layer: int) -> np.ndarray:
    """Spec §2.10 written out per position with Python ints; returns (T, (N-1)*K) head-local ids."""
    cfg = hasher.config
    mult = [int(v) for v in hasher.multipliers(layer)]
    primes = [int(v) for v in hasher.primes(layer)]
    out = []
    for t in range(len(x)):
        back = [x[t - j] if t - j >= 0 else hasher.pad_id for j in range(cfg.max_ngram_size)]
        mix, row = back[0] * mult[0], []
        for j in range(1, cfg.max_ngram_size):
            mix ^= back[j] * mult[j]
            row += [mix % p for p in primes[(j - 1) * cfg.n_head_per_ngram : j * cfg.n_head_per_ngram]]
        out.append(row)
    return np.array(out, dtype=np.int64)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_hash_matches_the_reference(n):
    cfg = NgramConfig(
        max_ngram_size=n, n_head_per_ngram=4, n_embed_per_ngram=16, engram_vocab_size=[97] * (n - 1), layer_ids=[1, 3]
    )
    hasher = NgramHasher(cfg, 1000, compressed_pad_id=7)
    ids = np.random.default_rng(n).integers(0, 1000, size=(3, 25)).tolist()
    got = hasher.hash(ids)
    assert sorted(got) == [1, 3]
    for layer, arr in got.items():
        assert arr.dtype == np.int64 and arr.shape == (3, 25, (n - 1) * 4)
        assert (arr >= 0).all() and (arr < hasher.primes(layer)).all()
        for b in range(3):
            np.testing.assert_array_equal(arr[b], reference_row_ids(ids[b], hasher, layer))


@pytest.mark.parametrize(
    "chunks", [[40], [1] * 40, [5, 11, 1, 1, 22], [2, 1, 37]], ids=["prefill", "decode", "chunked", "short-then-long"]
)
def test_continuation_equals_the_full_sequence_hash(chunks):
    cfg = NgramConfig(
        max_ngram_size=4, n_head_per_ngram=2, n_embed_per_ngram=8, engram_vocab_size=[53, 59, 61], layer_ids=[0, 5]
    )
    hasher = NgramHasher(cfg, 300, compressed_pad_id=0)
    ids = np.random.default_rng(1).integers(0, 300, size=(2, 40))
    full = hasher.hash(ids)
    lookback = [[], []]  # a fresh sequence: the hasher pads its start
    pos = 0
    for size in chunks:
        new = ids[:, pos : pos + size]
        part = hasher.hash_continuation(lookback, new)
        for layer in cfg.layer_ids:
            np.testing.assert_array_equal(part[layer], full[layer][:, pos : pos + size])
        lookback = hasher.next_lookback(lookback, new).tolist()  # what a snapshot keeps
        pos += size
    assert pos == 40
    assert lookback == ids[:, -3:].tolist()


def test_a_short_lookback_is_padded_like_the_sequence_start():
    cfg = NgramConfig(
        max_ngram_size=4, n_head_per_ngram=2, n_embed_per_ngram=8, engram_vocab_size=[53, 59, 61], layer_ids=[2]
    )
    hasher = NgramHasher(cfg, 300, compressed_pad_id=3)
    full = hasher.hash([[10, 20, 30, 40]])[2]
    np.testing.assert_array_equal(hasher.hash_continuation([[10]], [[20, 30, 40]])[2], full[:, 1:])
    assert hasher.next_lookback([[]], [[10]]).tolist() == [[3, 3, 10]]


def test_bad_input_is_refused_with_a_sentence():
    hasher = NgramHasher(NgramConfig(engram_vocab_size=[11, 13], layer_ids=[1]), 50)
    for bad in ([[1, 2], [3]], [1, 2, 3], [[1, 50]], [[-1]]):
        with pytest.raises(UsageError):
            hasher.hash(bad)
    with pytest.raises(UsageError, match="no N-gram layer"):
        hasher.primes(2)
    with pytest.raises(UsageError):
        hasher.hash_continuation([[1, 2, 3]], [[4]])  # more than N-1 lookback ids
    with pytest.raises(UsageError):
        NgramHasher(NgramConfig(engram_vocab_size=[11]), 50)  # one size for two orders
    with pytest.raises(UsageError):
        NgramHasher(NgramConfig(), 2)  # pad id 2 outside a 2-id vocabulary
