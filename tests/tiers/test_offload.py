"""The offload plan (tiers/offload.py) against stand-in GPUs, on synthetic numbers for a 7B-sized model. The same
plan on the real tiny GGUF's header: tests/engine/test_llama_offload.py."""

from __future__ import annotations

import pytest

from engramctl.tiers.offload import Gpu, LayerCost, ModelCost, gpu_sequences, plan_offload
from engramctl.tiers.plan import vram_reserve

GiB, MiB = 2**30, 2**20
# stand-in cards: (name, free, total); free is what a driver reports with a desktop on it
CARD_12GB = Gpu("NVIDIA GeForce RTX 4070", int(11.4 * GiB), 12 * GiB)
CARD_24GB = Gpu("NVIDIA GeForce RTX 4090", int(23.2 * GiB), 24 * GiB)
H100 = Gpu("NVIDIA H100 80GB HBM3", int(79.1 * GiB), int(79.6 * GiB))
CARD_6GB = Gpu("NVIDIA GeForce GTX 1660", int(5.6 * GiB), 6 * GiB)


def llama_7b(q4: bool = True) -> ModelCost:
    """A 7B llama-shaped model: 32 blocks, 8 KV heads x 128, a 32K vocabulary; Q4_K_M (~4.1 GB) or F16 (~13.5 GB).
    State: f16 K and V for 8,192 cells = 32 MiB a block."""
    block = 121 * MiB if q4 else 386 * MiB
    state = 2 * (1024 + 1024) * 8192
    embd = 70 * MiB if q4 else 250 * MiB
    return ModelCost(tuple(LayerCost(block, state) for _ in range(32)), output_bytes=embd + 16 * 1024, input_bytes=embd)


@pytest.mark.parametrize("gpu", [CARD_12GB, CARD_24GB, H100], ids=["12GB", "24GB", "H100"])
def test_a_7b_q4_model_goes_whole_onto_consumer_cards_and_an_h100(gpu):
    model = llama_7b()
    plan = plan_offload(model, gpu)
    assert plan.n_gpu_layers == plan.n_layers == 33  # 32 blocks + the output layer: llama.cpp's "33/33"
    assert plan.device == "cuda"
    assert plan.weights_gpu_bytes == 32 * 121 * MiB + model.output_bytes
    assert plan.weights_cpu_bytes == model.input_bytes  # the token embedding stays on the CPU
    assert plan.state_gpu_bytes == 32 * 32 * MiB and plan.state_cpu_bytes == 0
    assert plan.reserve_bytes == vram_reserve(gpu.total_bytes) == max(GiB, gpu.total_bytes // 10)
    assert plan.rule.startswith("every layer on the GPU:")
    assert f"= {_h(plan.weights_gpu_bytes + plan.state_gpu_bytes + plan.reserve_bytes)}" in plan.rule


def test_a_card_too_small_takes_the_last_blocks_that_fit():
    model = llama_7b()
    plan = plan_offload(model, CARD_6GB)
    room = CARD_6GB.free_bytes - GiB  # the reserve is the 1 GiB floor on a 6 GB card
    per_block = 121 * MiB + 32 * MiB
    assert plan.n_gpu_layers == room // per_block == 30  # fewer than the 32 blocks, no output layer
    assert plan.device == "cuda"
    assert plan.weights_gpu_bytes == 30 * 121 * MiB
    assert plan.weights_cpu_bytes == 2 * 121 * MiB + model.output_bytes + model.input_bytes
    assert plan.state_gpu_bytes == 30 * 32 * MiB and plan.state_cpu_bytes == 2 * 32 * MiB
    assert plan.rule.startswith("30 of 33 layers on the GPU: every layer would need")
    assert "> free VRAM 5.6 GiB" in plan.rule


def test_an_f16_7b_on_a_12gb_card_is_split():
    plan = plan_offload(llama_7b(q4=False), CARD_12GB)
    room = CARD_12GB.free_bytes - vram_reserve(CARD_12GB.total_bytes)
    assert plan.n_gpu_layers == room // (386 * MiB + 32 * MiB) < 32


def test_every_block_but_not_the_output_layer():
    """All blocks fit, the output matrix does not: llama.cpp's n_gpu_layers = n_layer keeps it on the CPU."""
    model = ModelCost(tuple(LayerCost(100 * MiB, 0) for _ in range(4)), output_bytes=300 * MiB, input_bytes=300 * MiB)
    gpu = Gpu("small", GiB + 500 * MiB, 4 * GiB)  # reserve 1 GiB: 500 MiB left
    plan = plan_offload(model, gpu)
    assert plan.n_gpu_layers == 4 and plan.n_layers == 5
    assert plan.weights_gpu_bytes == 400 * MiB and plan.weights_cpu_bytes == 600 * MiB


def test_not_even_one_block_fits():
    plan = plan_offload(llama_7b(), Gpu("tiny", GiB + 10 * MiB, 2 * GiB))
    assert plan.n_gpu_layers == 0 and plan.device == "cpu"
    assert plan.rule.startswith("0 of 33 layers on the GPU")
    assert plan.weights_cpu_bytes == llama_7b().weights_bytes


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"gpu": None}, "sees no GPU"),
        ({"gpu": CARD_24GB, "gpu_build": False}, "no GPU support (a CPU build)"),
        ({"gpu": CARD_24GB, "requested": "cpu"}, "--device cpu"),
    ],
    ids=["no-gpu", "cpu-build", "device-cpu"],
)
def test_no_layer_on_the_gpu_and_why(kwargs, why):
    model = llama_7b()
    plan = plan_offload(model, **kwargs)
    assert plan.n_gpu_layers == 0 and plan.device == "cpu"
    assert why in plan.rule and plan.rule.endswith("every layer on the CPU")
    assert plan.weights_gpu_bytes == plan.state_gpu_bytes == 0
    assert plan.weights_cpu_bytes == model.weights_bytes and plan.state_cpu_bytes == model.state_bytes
    j = plan.to_json()
    assert j["layers_on_gpu"] == 0 and j["layers"] == 33 and j["device"] == "cpu"


def test_the_vram_tier_gives_way_unless_the_user_set_it():
    """The default tier claims nothing ahead of the layers; a budget the user set does, and the rule says so."""
    model = llama_7b(q4=False)  # 12.9 GiB of weights + 1 GiB of state
    assert plan_offload(model, CARD_24GB).n_gpu_layers == 33
    claimed = plan_offload(model, CARD_24GB, vram_tier_bytes=10 * GiB)
    room = CARD_24GB.free_bytes - vram_reserve(CARD_24GB.total_bytes) - 10 * GiB
    assert claimed.n_gpu_layers == room // (386 * MiB + 32 * MiB) < 32
    assert "VRAM tier 10.0 GiB (set by the user)" in claimed.rule
    assert claimed.vram_tier_bytes == 10 * GiB


def test_tied_output_counts_the_embedding_once_on_the_cpu():
    """A tied output (no output.weight) is a copy of the token embedding on the GPU; the CPU keeps the original."""
    embd = 50 * MiB
    model = ModelCost((LayerCost(10 * MiB, MiB),) * 2, output_bytes=embd + 4096, input_bytes=embd, tied_bytes=embd)
    assert model.weights_bytes == 20 * MiB + 4096 + embd  # the file's tensors, each once
    all_on = plan_offload(model, CARD_12GB)
    assert all_on.n_gpu_layers == 3
    assert all_on.weights_gpu_bytes == 20 * MiB + embd + 4096 and all_on.weights_cpu_bytes == embd
    none = plan_offload(model, None)
    assert none.weights_cpu_bytes == model.weights_bytes


def test_sequences_default_from_vram():
    """A 7B hybrid-shaped model (recurrent cell ~140 MiB a conversation, 512 MiB of KV): the most whose state
    fits in half of what the weights and the reserve leave, up to the cap."""
    weights = int(4.2 * GiB)

    def state(n: int) -> int:
        return 512 * MiB + (n + 4) * 140 * MiB  # + 4 kept states' cells

    n, rule = gpu_sequences(CARD_12GB, weights, state, cap=16)
    share = (CARD_12GB.free_bytes - weights - vram_reserve(CARD_12GB.total_bytes)) // 2
    assert n == (share - 512 * MiB) // (140 * MiB) - 4 and 1 < n < 16
    assert state(n) <= share < state(n + 1)
    assert rule.startswith(f"{n} at once:") and "50% of (free VRAM 11.4 GiB" in rule
    assert gpu_sequences(H100, weights, state, cap=16)[0] == 16  # capped as on the CPU
    one, why = gpu_sequences(CARD_6GB, 5 * GiB, state, cap=16)  # the weights alone fill it
    assert one == 1 and "not even one does" in why


def _h(n: int) -> str:
    from engramctl.units import human_bytes

    return human_bytes(n)
