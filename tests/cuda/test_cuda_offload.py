"""The offload plan (engine/llama_offload.py, tiers/offload.py) on a CUDA build of llama.cpp with a GPU: every layer
of a tiny model goes to the GPU and the VRAM it then takes is within the plan; a plan for a smaller card puts only the
last blocks there and still computes what the CPU computes; the daemon's tier plan sees ggml's GPU. Skipped where
llama.cpp has no GPU support or sees no GPU (the CPU side of all this: tests/engine/test_llama_offload.py)."""

from __future__ import annotations

import numpy as np
import pytest

from engramctl.engine import llama_offload
from engramctl.engine.gguf_header import read_header
from engramctl.engine.loading import load_engine
from engramctl.tiers.offload import Gpu
from engramctl.tiers.plan import vram_reserve
from tests.cuda._common import record
from tests.helpers import served_app


def _gpu():
    try:
        from engramctl.engine.llama_lib import import_llama_cpp

        lib = import_llama_cpp()
    except Exception:  # noqa: BLE001 - no llama-cpp-python at all: skipped like a CPU build
        return None
    return llama_offload.gpu_memory(lib)


GPU = _gpu()
pytestmark = pytest.mark.skipif(GPU is None, reason="needs llama-cpp-python built with CUDA and a GPU")
IDS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]


def test_every_layer_goes_to_the_gpu_within_the_plan(served_model):
    path = served_model("llama.cpp")
    before = llama_offload.gpu_memory(_lib())
    engine = load_engine(str(path), path.parent, "auto", backend="llama.cpp")
    after = llama_offload.gpu_memory(_lib())
    o = engine.offload
    n = int(read_header(path).arch_value("block_count"))
    assert o.n_gpu_layers == n + 1 and engine.info.device == "cuda" and o.gpu.name == before.name
    taken = before.free_bytes - after.free_bytes
    record("offload", "vram_taken_bytes", taken)
    record("offload", "planned_gpu_bytes", o.weights_gpu_bytes + o.state_gpu_bytes)
    assert o.weights_gpu_bytes <= taken <= o.weights_gpu_bytes + o.state_gpu_bytes + vram_reserve(before.total_bytes)
    logits = engine.backend.prefill(engine.backend.new_live(), IDS)
    assert np.isfinite(logits).all()


def test_a_smaller_card_gets_the_last_blocks_and_computes_what_the_cpu_does(served_model, monkeypatch):
    path = served_model("llama.cpp")
    cpu = load_engine(str(path), path.parent, "cpu", backend="llama.cpp", sequences=1)
    want = cpu.backend.prefill(cpu.backend.new_live(), IDS)
    placed = llama_offload.place(
        _lib(),
        read_header(path),
        cpu.backend.layout,
        device="auto",
        context_tokens=None,
        sequences=1,
        threads=2,
        chunk_tokens=cpu.backend.chunk_tokens,  # the context the engine below counts (the same default)
    )
    cost = llama_offload.model_cost(read_header(path), cpu.backend.layout, placed.size)
    n = len(cost.layers)
    half = sum(lay.weights_bytes + lay.state_bytes for lay in cost.layers[n // 2 :])
    small = Gpu(GPU.name, vram_reserve(GPU.total_bytes) + half + 1, GPU.total_bytes)
    monkeypatch.setattr(llama_offload, "gpu_memory", lambda _lib: small)
    engine = load_engine(str(path), path.parent, "auto", backend="llama.cpp", sequences=1)
    assert engine.offload.n_gpu_layers == n - n // 2
    got = engine.backend.prefill(engine.backend.new_live(), IDS)
    record("offload", "split_max_logit_diff", float(np.abs(got - want).max()))
    assert int(np.argmax(got)) == int(np.argmax(want))
    assert np.allclose(got, want, atol=1e-2, rtol=1e-2)


def test_the_daemons_tier_plan_sees_the_gpu_llama_cpp_sees(served_model):
    path = served_model("llama.cpp")
    engine = load_engine(str(path), path.parent, "auto", backend="llama.cpp")
    with served_app(engine) as client:
        tiers = client.get("/v1/tiers").json()
    assert tiers["hardware"]["gpu"] == GPU.name and tiers["hardware"]["vram_total_bytes"] == GPU.total_bytes
    assert "keeps no snapshot copies in VRAM" in tiers["tiers"][0]["rule"]
    assert tiers["offload"]["layers_on_gpu"] == tiers["offload"]["layers"]
    assert tiers["serving"]["at_once"] == tiers["offload"]["sequences"] == engine.max_sequences


def _lib():
    from engramctl.engine.llama_lib import import_llama_cpp

    return import_llama_cpp()
