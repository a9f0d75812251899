"""A short message on a restored state runs the chunked scan with a chunk fitted to it
(engine/scan_chunk.py), and stays exact: same logits as a full forward of the whole sequence."""

from __future__ import annotations

import pytest
import torch

from engramctl.engine.families import RECURRENT_FAMILIES
from engramctl.engine.scan_chunk import fitted_chunk_tokens
from tests.factory import FAMILIES

# Every recurrent family of the factory that continues a state with multi-token forwards (the Mamba1
# families feed one token per forward after the first, so they have no chunk to fit).
CHUNKED = [f for f in FAMILIES if f in RECURRENT_FAMILIES and not RECURRENT_FAMILIES[f].token_by_token]
FITTED = [f for f in CHUNKED if RECURRENT_FAMILIES[f].scan_mixer is not None]
N_STATE, TOL = 40, 1e-4  # the tiny configs' scan chunk is 64: every message below is shorter


def _ids(n: int, seed: int = 3) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _full_logits(backend, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():  # no cache at all, the configured chunk: the reference
        return backend.model(input_ids=torch.tensor([ids])).logits[0].float()


def _chunks_seen(backend) -> list[int]:
    """Record the first mixer's chunk length at each of its forwards."""
    seen: list[int] = []
    if backend.scan_chunks.mixers:
        backend.scan_chunks.mixers[0].register_forward_pre_hook(lambda m, args: seen.append(m.chunk_size))
    return seen


@pytest.mark.parametrize("family", CHUNKED)
@pytest.mark.parametrize("n_message", [5, 32])
def test_short_continuation_on_a_restored_state_matches_the_full_forward(zoo, load_backend, family, n_message):
    backend = load_backend(zoo.path(family), chunk_tokens=256)  # the message is one forward
    ids = _ids(N_STATE + n_message)
    full = _full_logits(backend, ids)
    live = backend.new_live()
    backend.prefill(live, ids[:N_STATE])
    state = backend.capture(live)
    seen = _chunks_seen(backend)

    resumed = backend.inject(state)
    logits = backend.prefill(resumed, ids[N_STATE:])

    assert (logits - full[-1]).abs().max().item() <= TOL
    # the check can fail: the state matters to these logits
    fresh = backend.prefill(backend.new_live(), ids[N_STATE:])
    assert (fresh - full[-1]).abs().max().item() > TOL
    if family in FITTED:
        assert seen[0] == n_message  # the scan really ran on an unpadded chunk
        assert [m.chunk_size for m in backend.scan_chunks.mixers] == backend.scan_chunks.base_tokens


@pytest.mark.parametrize("family", FITTED)
def test_a_prompt_crossing_scan_chunks_in_one_forward_matches_the_full_forward(zoo, load_backend, family):
    # 150 tokens over a 64-token chunk: 3 chunks of 50 instead of 3 of 64 with 42 padded positions
    backend = load_backend(zoo.path(family), chunk_tokens=256)
    ids = _ids(150, seed=4)
    full = _full_logits(backend, ids)
    seen = _chunks_seen(backend)
    logits = backend.prefill(backend.new_live(), ids)
    assert seen == [50]
    assert (logits - full[-1]).abs().max().item() <= TOL


@pytest.mark.parametrize("family", FITTED)
def test_every_mamba2_mixer_is_fitted(zoo, load_backend, family):
    """A renamed mixer class in a future transformers would silently bring the padding back."""
    backend = load_backend(zoo.path(family))
    mixers = backend.scan_chunks.mixers
    n_states = sum(1 for layer in backend.spec.layers if "recurrent" in layer.tensors)
    assert len(mixers) == n_states > 0
    assert backend.scan_chunks.base_tokens == [64] * n_states  # tests/factory.py's configured chunk


def test_the_configured_chunk_comes_back_even_when_the_forward_fails(zoo, load_backend):
    backend = load_backend(zoo.path("granitemoehybrid"))
    with pytest.raises(RuntimeError, match="boom"):
        with backend.scan_chunks.fitted(5):
            assert {m.chunk_size for m in backend.scan_chunks.mixers} == {5}
            raise RuntimeError("boom")
    assert [m.chunk_size for m in backend.scan_chunks.mixers] == backend.scan_chunks.base_tokens


@pytest.mark.parametrize(
    ("n_tokens", "chunk", "fitted"),
    [
        (1, 256, 1),
        (32, 256, 32),
        (255, 256, 255),
        (256, 256, 256),
        (257, 256, 129),
        (300, 256, 150),
        (512, 256, 256),
        (600, 256, 200),
        (40, 64, 40),
        (150, 64, 50),
    ],
)
def test_fitted_chunk_keeps_the_chunk_count_and_drops_the_padding(n_tokens, chunk, fitted):
    got = fitted_chunk_tokens(n_tokens, chunk)
    assert got == fitted
    n_chunks = -(-n_tokens // chunk)
    assert -(-n_tokens // got) == n_chunks and got <= chunk
    assert got * n_chunks - n_tokens < n_chunks  # padding: under one position per chunk


def test_fitted_chunk_refuses_empty_lengths():
    with pytest.raises(ValueError):
        fitted_chunk_tokens(0, 256)
