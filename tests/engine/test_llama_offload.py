"""The llama.cpp backend's offload plan (engine/llama_offload.py over tiers/offload.py) on real GGUF files: each
layer's bytes from the header's tensor table, the plan on stand-in GPUs, the CPU build loading with no layer on the
GPU and saying why, and /v1/tiers showing it. The rule's arithmetic on synthetic numbers:
tests/tiers/test_offload.py."""

from __future__ import annotations

import pytest

from engramctl.engine import llama_backend, llama_offload
from engramctl.engine.gguf_header import read_header, tensor_sizes
from engramctl.engine.llama_context import context_size
from engramctl.engine.llama_layout import blob_layout
from engramctl.engine.loading import load_engine, smollm2_gguf
from engramctl.tiers.offload import Gpu, plan_offload
from engramctl.tiers.plan import vram_reserve
from tests.helpers import served_app

GiB, MiB = 2**30, 2**20
CARD_12GB = Gpu("NVIDIA GeForce RTX 4070", int(11.4 * GiB), 12 * GiB)


def _cost(path, sequences=4):
    header = read_header(path)
    layout = blob_layout(header, v_trans=False)
    size = context_size(layout, None, sequences, 2, n_ctx_train=int(header.arch_value("context_length")))
    return header, layout, size, llama_offload.model_cost(header, layout, size)


def _models(served_model):
    paths = [served_model("llama.cpp")]
    if smollm2_gguf() is not None:
        paths.append(smollm2_gguf())  # a real model with a tied output (no output.weight)
    return paths


def test_every_tensor_is_counted_once(served_model):
    for path in _models(served_model):
        header, layout, size, cost = _cost(path)
        sizes = tensor_sizes(header)
        assert cost.weights_bytes == sum(sizes.values())
        assert len(cost.layers) == int(header.arch_value("block_count"))
        blocks = [sum(n for name, n in sizes.items() if name.startswith(f"blk.{i}.")) for i in range(len(cost.layers))]
        assert [lay.weights_bytes for lay in cost.layers] == blocks and all(blocks)
        assert cost.input_bytes >= sizes["token_embd.weight"]
        tied = "output.weight" not in sizes
        assert cost.tied_bytes == (sizes["token_embd.weight"] if tied else 0)
        # the state: f16 K/V for every cell of the attention layers, an f32 cell a sequence for the recurrent ones
        kv = sum(2 * (lay.k_elems + lay.v_elems) for lay in layout.layers) * size.cells
        cells = sum(4 * _prod(lay.conv_shape) + 4 * _prod(lay.ssm_shape) for lay in layout.layers if lay.recurrent)
        assert cost.state_bytes == kv + cells * size.n_seq_max > 0


def test_tensor_sizes_agree_with_llama_cpp(served_model):
    """The header's offsets give what llama.cpp loads, to within the alignment padding of each tensor."""
    path = served_model("llama.cpp")
    engine = load_engine(str(path), path.parent, "cpu", backend="llama.cpp")
    sizes = tensor_sizes(read_header(path))
    assert 0 <= sum(sizes.values()) - engine.info.weights_bytes <= 32 * len(sizes)


def test_the_plan_on_stand_in_cards_from_the_real_header(served_model):
    for path in _models(served_model):
        _, _, _, cost = _cost(path)
        n = len(cost.layers)
        assert plan_offload(cost, CARD_12GB).n_gpu_layers == n + 1  # tiny models: all of it
        # a card whose free VRAM past the reserve holds only about half of the blocks
        half = sum(lay.weights_bytes + lay.state_bytes for lay in cost.layers[n // 2 :])
        card = Gpu("small", vram_reserve(GiB) + half + 1, GiB)
        plan = plan_offload(cost, card)
        assert plan.n_gpu_layers == n - n // 2
        gpu_weights = sum(lay.weights_bytes for lay in cost.layers[n // 2 :])
        assert plan.weights_gpu_bytes == gpu_weights
        assert plan.weights_cpu_bytes == cost.weights_bytes - gpu_weights
        assert plan.rule.startswith(f"{n - n // 2} of {n + 1} layers on the GPU")


def test_the_cpu_build_loads_with_no_gpu_layer_and_tiers_say_why(served_model):
    from engramctl.engine.llama_lib import import_llama_cpp

    lib = import_llama_cpp()
    if lib.llama_supports_gpu_offload():
        pytest.skip("this llama-cpp-python has GPU support: tests/cuda covers it")
    path = served_model("llama.cpp")
    engine = load_engine(str(path), path.parent, "auto", backend="llama.cpp")
    o = engine.offload
    assert o.n_gpu_layers == 0 and engine.info.device == "cpu" and engine.gpu_memory() is None
    assert "no GPU support (a CPU build)" in o.rule
    assert o.sequences == engine.max_sequences and "from the CPU cores" in o.sequences_rule
    with served_app(engine) as client:
        tiers = client.get("/v1/tiers").json()
    j = tiers["offload"]
    n = int(read_header(path).arch_value("block_count"))
    assert j["layers_on_gpu"] == 0 and j["layers"] == n + 1 and j["device"] == "cpu" and j["gpu"] is None
    assert j["rule"] == o.rule and j["weights_gpu_bytes"] == 0
    assert j["weights_cpu_bytes"] == sum(tensor_sizes(read_header(path)).values())
    assert tiers["tiers"][0]["rule"].startswith("no CUDA device in this process")


def test_a_stand_in_gpu_gets_every_layer_and_the_tier_plan_sees_its_vram(served_model, monkeypatch):
    """The wiring with a GPU the CPU build cannot use (llama.cpp then keeps every layer on its only device, the
    CPU): the plan asks for every layer, the conversations at once default from VRAM, and the tier plan starts
    from the same VRAM figure, with the VRAM tier off because llama.cpp's states are host arrays."""
    from engramctl.engine.llama_lib import import_llama_cpp

    lib = import_llama_cpp()
    monkeypatch.setattr(lib, "llama_supports_gpu_offload", lambda: True)
    monkeypatch.setattr(llama_offload, "gpu_memory", lambda _lib: CARD_12GB)
    monkeypatch.setattr(llama_backend, "gpu_memory", lambda _lib: CARD_12GB)
    path = served_model("llama.cpp")
    engine = load_engine(str(path), path.parent, "auto", backend="llama.cpp")
    o = engine.offload
    n = int(read_header(path).arch_value("block_count"))
    assert o.n_gpu_layers == n + 1 and o.gpu == CARD_12GB and engine.info.device == "cuda"
    assert o.rule.startswith("every layer on the GPU:") and "free VRAM 11.4 GiB" in o.rule
    assert engine.max_sequences == o.sequences == 16  # a tiny model's state: the cap
    assert o.sequences_rule.startswith("16 at once: the most (up to 16)")
    with served_app(engine) as client:
        tiers = client.get("/v1/tiers").json()
    assert tiers["hardware"]["vram_total_bytes"] == CARD_12GB.total_bytes
    assert tiers["hardware"]["gpu"] == CARD_12GB.name
    vram = tiers["tiers"][0]
    assert vram["budget_bytes"] == 0 and "keeps no snapshot copies in VRAM" in vram["rule"]
    assert tiers["offload"]["layers_on_gpu"] == n + 1 and tiers["offload"]["vram_free_bytes"] == CARD_12GB.free_bytes
    assert tiers["serving"]["at_once"] == 16
    # llama.cpp's own VRAM tier: device copies of parked states, from what every layer and the reserve leave
    copies = tiers["device_copies"]
    assert copies["slots"] == engine.device_slots > 0 and copies["rule"].startswith("50% of (free VRAM 11.4 GiB")
    assert 0 < copies["budget_bytes"] < CARD_12GB.free_bytes // 2 and copies["held"] == 0


def test_device_cpu_forces_no_layer(served_model, monkeypatch):
    from engramctl.engine.llama_lib import import_llama_cpp

    monkeypatch.setattr(import_llama_cpp(), "llama_supports_gpu_offload", lambda: True)
    monkeypatch.setattr(llama_offload, "gpu_memory", lambda _lib: CARD_12GB)
    path = served_model("llama.cpp")
    engine = load_engine(str(path), path.parent, "cpu", backend="llama.cpp", sequences=3)
    assert engine.offload.n_gpu_layers == 0 and engine.offload.rule.startswith("--device cpu")
    assert engine.device_slots == 0 and engine.device_copies()["rule"] == "off: no layer is on a GPU"
    assert engine.max_sequences == 3 and engine.offload.sequences_rule.startswith("3 at once: set by --sequences")


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out
