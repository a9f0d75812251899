"""N-gram layers (engine/ngram_hooks.py) on a transformers model: the config the settings give, hooks on
the chosen blocks, the per-layer state in SessionState, chunking invariance and the model identity."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engramctl.ngram.config import ngram_config
from engramctl.engine.hf_backend import TransformersBackend
from engramctl.engine.loading import load_engine
from engramctl.errors import SnapshotMismatch, UnsupportedModel, UsageError
from engramctl.ngram.hashing import NgramConfig
from engramctl.state import NgramState
from engramctl.state.codec import from_payload, to_payload

NGRAM = NgramConfig(n_embed_per_ngram=64, engram_vocab_size=[53, 59], layer_ids=[1, 3], seed=3)
FAMILY = "granitemoehybrid"  # L A L L: Engram before an attention block and a Mamba block


def _load(zoo, ngram=NGRAM, chunk_tokens=16):
    model_dir = zoo.path(FAMILY)
    backend = TransformersBackend.load(model_dir, model_dir.name, "cpu", torch.float32, ngram=ngram)
    backend.chunk_tokens = chunk_tokens
    return backend


def _ids(n):
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(4)).tolist()


def test_settings_text_becomes_a_demo_config():
    cfg = ngram_config(" 1, 15", 1000)
    assert cfg.layer_ids == (1, 15) and cfg.engram_vocab_size == (1000, 1000)
    assert (cfg.max_ngram_size, cfg.n_head_per_ngram, cfg.n_embed_per_ngram, cfg.kernel_size) == (3, 8, 512, 4)
    assert ngram_config(None, 1000) is None and ngram_config("", 1000) is None
    with pytest.raises(UsageError):
        ngram_config("one", 1000)


def test_state_holds_one_ngram_entry_per_ngram_layer_and_the_identity_changes(zoo):
    backend, plain = _load(zoo), _load(zoo, ngram=None)
    assert backend.spec.layout == plain.spec.layout + ("ngram", "ngram")
    tail = backend.spec.layers[-1].tensors
    assert tail["conv"].shape == (1, 64, 9) and (tail["lookback"].shape, tail["lookback"].dtype) == ((1, 2), "int64")
    assert backend.info.fingerprint != plain.info.fingerprint
    assert _load(zoo, ngram=dataclasses.replace(NGRAM, seed=4)).info.fingerprint != backend.info.fingerprint
    assert _load(zoo).info.fingerprint == backend.info.fingerprint  # rebuilt from the seed: same model
    # a snapshot of the plain model is refused by the Engram one, with a sentence
    live = plain.new_live()
    plain.prefill(live, _ids(5))
    tensors, meta = to_payload(plain.capture(live), plain.spec, {})
    with pytest.raises(SnapshotMismatch):
        from_payload(tensors, meta, backend.spec)


def test_chunked_prefill_and_decode_equal_one_whole_prefill(zoo):
    ids = _ids(30)
    whole = _load(zoo, chunk_tokens=64)
    one = whole.new_live()
    want = whole.prefill(one, ids)
    chunked = _load(zoo, chunk_tokens=7)
    live = chunked.new_live()
    chunked.prefill(live, ids[:-3])
    for t in ids[-3:]:
        got = chunked.decode(live, t)
    assert (got - want).abs().max().item() <= 1e-4
    for a, b in zip(live.ngram, one.ngram):
        assert torch.equal(a.lookback, b.lookback) and (a.conv - b.conv).abs().max().item() <= 1e-5
    assert all(isinstance(s, NgramState) for s in chunked.capture(live).layers[-2:])


def test_a_block_past_the_model_and_llama_cpp_are_refused(zoo, tmp_path):
    with pytest.raises(UsageError, match="past this model"):
        _load(zoo, ngram=dataclasses.replace(NGRAM, layer_ids=[1, 4]))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(UnsupportedModel, match="transformers backend only"):
        load_engine(str(gguf), tmp_path, backend="llama.cpp", ngram=NGRAM)


def test_transformers_and_gguf_tokenizers_of_one_model_compress_alike(gguf_zoo, load_llama, zoo):
    """The map can be built from either tokenizer the engine loads; for the same vocabulary they agree."""
    from engramctl.engine.ngram_hooks import tokenizer_map

    hf = _load(zoo, ngram=None).tokenizer
    gg = load_llama(gguf_zoo.path(FAMILY)).tokenizer
    a, b = tokenizer_map(hf), tokenizer_map(gg)
    assert a.compressed_vocab_size < len(a.token_map) and (a.token_map == b.token_map).all()


def test_the_daemon_settings_give_the_served_model_ngram_layers(zoo):
    from engramctl.daemon.model import load_model
    from engramctl.settings import load_settings

    flags = {"model": str(zoo.path(FAMILY)), "device": "cpu", "dtype": "float32"}
    engine = load_model(load_settings({**flags, "ngram_layers": "1", "ngram_table_rows": 31}, env={}))
    assert engine.backend.spec.layout[-1] == "ngram" and engine.backend.engram.config.layer_ids == (1,)
    with pytest.raises(UsageError):
        load_settings({**flags, "ngram_table_rows": 1}, env={})
