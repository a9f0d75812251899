"""Families that cannot be resumed exactly are refused with a message, never served wrong."""

import pytest
import torch

from engramctl.engine.families import RECURRENT_FAMILIES, family_for
from engramctl.engine.hf_backend import TransformersBackend
from engramctl.errors import UnsupportedModel


def test_unverified_recurrent_family_is_refused():
    with pytest.raises(UnsupportedModel, match="not verified to resume exactly"):
        family_for("some_new_ssm", ["LinearAttentionLayer", "DynamicLayer"])


def test_mamba1_families_resume_token_by_token():
    assert all(RECURRENT_FAMILIES[f].token_by_token for f in ("mamba", "falcon_mamba", "jamba"))
    assert not RECURRENT_FAMILIES["granitemoehybrid"].token_by_token


def test_real_sliding_window_model_is_refused(tmp_path):
    from transformers import AutoModelForCausalLM, MistralConfig

    cfg = MistralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=8,
    )
    model = AutoModelForCausalLM.from_config(cfg).eval()

    class Tok:
        eos_token_id = 1

    from engramctl.engine.tokenizer import ChatTokenizer

    with pytest.raises(UnsupportedModel, match="sliding-window"):
        TransformersBackend(model, ChatTokenizer(Tok()), "mistral-tiny")


def test_token_by_token_family_feeds_one_token_per_forward_after_the_first(zoo, load_backend):
    backend = load_backend(zoo.path("mamba"), chunk_tokens=16)
    sizes = []
    original = backend._forward
    backend._forward = lambda live, ids: (sizes.append(len(ids)), original(live, ids))[1]
    live = backend.new_live()
    backend.prefill(live, list(range(3, 23)))
    backend.prefill(live, list(range(3, 7)))
    assert sizes == [20, 1, 1, 1, 1]
    assert torch.isfinite(live.last_logits).all()


def test_prefill_stops_between_chunks_when_cancelled(zoo, load_backend):
    import threading

    from engramctl.errors import Cancelled

    backend = load_backend(zoo.path("granitemoehybrid"), chunk_tokens=16)
    cancel = threading.Event()
    original = backend._forward
    backend._forward = lambda live, ids: (original(live, ids), cancel.set())[0]  # cancel after chunk 1
    live = backend.new_live()
    with pytest.raises(Cancelled, match="prompt prefill"):
        backend.prefill(live, list(range(3, 43)), cancel)
    assert len(live.token_ids) == 16  # whole chunks only: the state stays consistent
