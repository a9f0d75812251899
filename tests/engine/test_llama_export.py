"""engramctl.engine.gguf_export: a model directory becomes an f16 or Q8_0 GGUF that llama.cpp serves in
that type (what the bench does with its Granite-4.0-H preset), agreeing with the f32 export."""

from __future__ import annotations

import pytest
import torch

from engramctl.engine.gguf_export import export_many
from engramctl.errors import UnsupportedModel
from tests.gguf_factory import PRETOKENIZER


def test_f16_and_q8_0_exports_keep_their_type_and_agree(gguf_zoo, zoo, load_llama, tmp_path):
    src = zoo.path("granitemoehybrid")
    export_many(
        [(src, tmp_path / "m.f16.gguf", "f16"), (src, tmp_path / "m.q8.gguf", "q8_0")],
        pretokenizer_fallback=PRETOKENIZER,
    )
    ids = torch.randint(3, 512, (30,), generator=torch.Generator().manual_seed(9)).tolist()
    f32 = load_llama(gguf_zoo.path("granitemoehybrid"))
    ref = torch.from_numpy(f32.prefill(f32.new_live(), ids))  # llama.cpp's logits: numpy
    sizes = {}
    for name, want in (("m.f16.gguf", "F16"), ("m.q8.gguf", "Q8_0")):
        backend = load_llama(tmp_path / name)
        assert backend.info.weight_type == want
        sizes[want] = backend.info.weights_bytes
        logits = torch.from_numpy(backend.prefill(backend.new_live(), ids))
        # a random model's logits are flat (top two ~0.01 apart), so only closeness is asserted
        assert int(ref.argmax()) in torch.topk(logits, 5).indices.tolist()
        assert ((logits - ref).norm() / ref.norm()).item() < 5e-2
        assert backend.info.fingerprint != f32.info.fingerprint  # other weights, other snapshots
    assert sizes["Q8_0"] < sizes["F16"] < f32.info.weights_bytes


def test_an_unknown_pretokenizer_is_refused_unless_mapped(zoo, tmp_path, gguf_zoo):
    with pytest.raises(UnsupportedModel, match="BPE pre-tokenizer was not recognized"):
        export_many([(zoo.path("nemotron_h"), tmp_path / "x.gguf", "f32")])
    with pytest.raises(UnsupportedModel, match="not one of f32, f16, q8_0"):
        export_many([(zoo.path("nemotron_h"), tmp_path / "x.gguf", "q4_k")])
