"""engine/device.py on a machine that has a CUDA GPU: auto picks it, auto dtype is bf16 there, and the
real loading path (engine/loading.py load_engine) puts a model on the GPU with what was picked."""

from __future__ import annotations

import pytest
import torch

from engramctl.engine import device
from tests.cuda._common import requires_cuda, token_ids

pytestmark = requires_cuda


def test_pick_device_and_dtype_on_a_cuda_machine():
    assert device.pick_device("auto") == "cuda"
    assert device.pick_device("cuda") == "cuda"
    assert device.pick_device("cpu") == "cpu"
    assert device.pick_dtype("auto", "cuda") is torch.bfloat16
    assert torch.cuda.is_bf16_supported()  # so the auto choice can actually run here
    assert device.pick_dtype("float32", "cuda") is torch.float32
    assert device.pick_dtype("float16", "cuda") is torch.float16


@pytest.mark.parametrize(("dev", "dtype", "want"), [("auto", "auto", "bfloat16"), ("cuda", "float32", "float32")])
def test_load_engine_puts_the_model_on_the_gpu(zoo, tmp_path, dev, dtype, want):
    from engramctl.engine.loading import load_engine

    engine = load_engine(str(zoo.path("granitemoehybrid")), tmp_path / "cache", dev, dtype)
    backend = engine.backend
    assert engine.info.device.startswith("cuda") and engine.info.dtype == want == engine.spec.dtype
    assert all(p.is_cuda and str(p.dtype) == f"torch.{want}" for p in backend.model.parameters())
    live = backend.new_live()
    logits = backend.prefill(live, token_ids(24, seed=5))
    assert logits.is_cuda and logits.dtype is torch.float32 and bool(torch.isfinite(logits).all())
    state = backend.capture(live)
    named = [(name, t) for layer in state.layers for name, t in layer.tensors().items()]
    assert named and all(t.is_cuda for _, t in named)
    # K/V are in the model's dtype; a scan may keep its SSM state wider (the spec records each tensor's)
    assert all(str(t.dtype) == f"torch.{want}" for name, t in named if name in ("keys", "values"))
