"""The llama.cpp backend's offload plan (tiers/offload.py) fed from this model and this machine: the GPU's
free VRAM through ggml's device calls, each layer's bytes from the GGUF header's tensor table, each layer's
state from the context's size (llama_context.py), and the conversations served at once on a GPU.

VRAM is read through ggml's device registry (ggml_devices.py: ggml_backend_dev_memory on the first GPU device),
the figure llama.cpp itself splits layers by, with no torch. Where the registry cannot be read, nvidia-smi.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engramctl.engine import ggml_devices, llama_state
from engramctl.engine.gguf_header import GgufHeader, tensor_sizes
from engramctl.engine.llama_context import (
    SEQUENCES_MAX,
    ContextSize,
    context_size,
    layer_state_bytes,
    with_device_copies,
)
from engramctl.tiers.hardware import nvidia_smi_memory
from engramctl.tiers.offload import Gpu, LayerCost, ModelCost, OffloadPlan, cpu_reason, gpu_sequences, plan_offload
from engramctl.tiers.plan import VRAM_SHARE
from engramctl.units import human_bytes

_BLOCK = re.compile(r"blk\.(\d+)\.")
_OUTPUT = ("output.weight", "output.bias", "output_norm.weight", "output_norm.bias")


def gpu_memory(lib) -> Gpu | None:
    """The first GPU ggml registered (a CUDA build sees the CUDA devices once llama_backend_init ran), its
    free and total memory now; None on a CPU build or without a GPU."""
    if not lib.llama_supports_gpu_offload():
        return None
    found = ggml_devices.gpus()
    if found is None:  # the registry cannot be read: ask the driver
        smi = nvidia_smi_memory()
        return None if smi is None else Gpu(smi[2], smi[0], smi[1])
    return found[0] if found else None


def model_cost(header: GgufHeader, layout: llama_state.BlobLayout, size: ContextSize) -> ModelCost:
    """Each block's weights (blk.N.*) and state, the output layer (output matrix and norm; the token embedding,
    copied, where the output is tied to it) and the rest (token embedding and any other tensor: the CPU's)."""
    sizes = tensor_sizes(header)
    blocks = [0] * len(layout.layers)
    output = rest = 0
    for name, n in sizes.items():
        m = _BLOCK.match(name)
        if m and int(m.group(1)) < len(blocks):
            blocks[int(m.group(1))] += n
        elif name in _OUTPUT:
            output += n
        else:
            rest += n
    tied = 0
    if "output.weight" not in sizes:  # tied: llama.cpp loads the token embedding a second time for the output
        tied = sizes.get("token_embd.weight", 0)
    state = layer_state_bytes(size, layout)
    return ModelCost(tuple(LayerCost(w, s) for w, s in zip(blocks, state)), output + tied, rest, tied)


@dataclass(frozen=True)
class Placement:
    plan: OffloadPlan
    size: ContextSize  # the context the plan counted: what the backend creates
    n_ctx_train: int  # what the size was computed from (the GGUF header's), checked against llama.cpp's
    swa: bool
    copies_rule: str = ""  # the VRAM tier's (device copies') budget in words


def place(
    lib,
    header: GgufHeader,
    layout: llama_state.BlobLayout,
    *,
    device: str,
    context_tokens: int | None,
    sequences: int | None,
    threads: int,
    chunk_tokens: int,
    vram_tier_bytes: int | None = None,
    copies_bytes: int | None = None,
) -> Placement:
    """The offload plan and the context it counted, before the model loads. On a GPU the conversations served
    at once default from VRAM (gpu_sequences), else from the cores (llama_context.default_sequences). The VRAM
    tier (device copies of parked states) gets `vram_tier_bytes` (the user's budget, claimed ahead of the layers)
    or, by default, VRAM_SHARE of what every layer and the reserve leave, and nothing when a layer stays on the
    CPU (the tier gives way first); without a GPU, none. `copies_bytes` sets the copies' budget whatever the
    device (tests and probes: on the CPU build the copies are in host memory)."""
    gpu_build = bool(lib.llama_supports_gpu_offload())
    gpu = gpu_memory(lib) if device != "cpu" else None
    n_ctx_train = int(header.arch_value("context_length", 0) or 0)
    swa = bool(header.arch_value("attention.sliding_window", 0))

    def size_for(n: int | None) -> ContextSize:
        return context_size(layout, context_tokens, n, threads, n_ctx_train=n_ctx_train, swa=swa)

    on_gpu = cpu_reason(device, gpu_build, gpu) is None and gpu is not None
    if sequences is not None:
        seq_rule = f"{sequences} at once: set by --sequences / ENGRAM_SEQUENCES"
    elif on_gpu:
        weights = model_cost(header, layout, size_for(1))
        sequences, seq_rule = gpu_sequences(
            gpu,
            weights.gpu_bytes(len(weights.layers) + 1)[0],
            lambda n: model_cost(header, layout, size_for(n)).state_bytes,
            SEQUENCES_MAX,
        )
    else:
        seq_rule = "from the CPU cores and available RAM (no GPU takes layers)"
    size = size_for(sequences)
    if not sequences:
        seq_rule = f"{size.sequences} at once: " + seq_rule
    claimed = vram_tier_bytes if on_gpu and vram_tier_bytes else 0

    def plan_for(size: ContextSize) -> OffloadPlan:
        return plan_offload(
            model_cost(header, layout, size),
            gpu,
            requested=device,
            gpu_build=gpu_build,
            vram_tier_bytes=claimed,
            sequences=size.sequences,
            sequences_rule=seq_rule,
        )

    plan = plan_for(size)
    budget, rule = _copies_budget(plan, gpu, claimed, copies_bytes)
    sized = with_device_copies(size, layout, budget, chunk_tokens)
    if sized.device_slots:
        rule += (
            f": {sized.device_slots} slots (each a recurrent cell in the context, "
            f"{human_bytes(budget - sized.device_bytes)} in all), {human_bytes(sized.device_bytes)} for the copies"
        )
        size, plan = sized, plan_for(sized)
    elif budget:
        rule += ": not one parked state fits it, or the model keeps a KV stream per conversation: tier off"
    return Placement(plan, size, n_ctx_train, swa, rule)


def _copies_budget(plan: OffloadPlan, gpu: Gpu | None, claimed: int, forced: int | None) -> tuple[int, str]:
    """The bytes device copies of parked states may take (the context's slots included), and why."""
    if forced is not None:
        return forced, f"{human_bytes(forced)}, as the backend was asked (on a CPU build, in host memory)"
    if gpu is None or plan.n_gpu_layers < plan.n_layers:
        return 0, "off: " + ("no layer is on a GPU" if not plan.n_gpu_layers else "layers come before the VRAM tier")
    if claimed:
        return claimed, f"{human_bytes(claimed)}, set by config.toml / ENGRAM_TIER_VRAM_BYTES / --tier-vram-bytes"
    room = gpu.free_bytes - plan.weights_gpu_bytes - plan.state_gpu_bytes - plan.reserve_bytes
    budget = int(VRAM_SHARE * max(0, room))
    return budget, (
        f"{VRAM_SHARE:.0%} of (free VRAM {human_bytes(gpu.free_bytes)} - weights {human_bytes(plan.weights_gpu_bytes)}"
        f" - state {human_bytes(plan.state_gpu_bytes)} - reserve {human_bytes(plan.reserve_bytes)})"
        f" = {human_bytes(budget)}"
    )
