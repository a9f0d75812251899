"""Which layers of a llama.cpp model run on the GPU, and how many conversations are served at once there,
planned from free VRAM and what each layer takes on the device. Plain numbers in, no engine import: the
llama.cpp backend (engine/llama_offload.py) reads them from the GGUF header and the context's size.

What llama.cpp places where (0c1e570, src/llama-model.cpp load_tensors): `n_gpu_layers` counts the n_layer
blocks plus one "output layer" (the output matrix, or the tied token embedding copied there, and the output
norm); it offloads the *last* blocks first and the output layer only with every block, so n_gpu_layers =
n_layer + 1 is every layer. The input layer (the token embedding) stays on the CPU whatever it is. With
offload_kqv (on: llama_context.py) a block's KV cache and recurrent cells are allocated on its block's device,
so a block on the GPU costs its weights + its KV (bytes per token x the context's cells) + its recurrent cells
(one per sequence of the context: the conversations served at once and the kept states).

The rule, `--device auto` (or cuda) on a build with GPU support and a GPU:
- every layer when all of it (weights + state) + the working reserve (plan.py's, the VRAM tier's reserve:
  max(1 GiB, 10% of total VRAM), for compute buffers and the CUDA context) + the VRAM tier's claim fit in free VRAM;
- else the most trailing blocks that fit in free VRAM - reserve - the tier's claim; the output layer stays on
  the CPU with the rest.
The VRAM tier gives way first: its default rule (plan.py) takes a share of what the layers leave, so it claims
nothing here; only a budget a user set claims its bytes ahead of the layers. A layer on the CPU slows every
token of every conversation (decode reads every weight for each token, and host memory is 10-50x slower than
VRAM), while a smaller VRAM tier only makes resuming a parked conversation pay one host-to-device copy.

Conversations served at once on a GPU (`gpu_sequences`, when the user sets none): the most, up to the CPU
rule's cap, whose device state (KV + recurrent cells) takes at most half of what every weight and the reserve
leave of free VRAM; the other half is the VRAM tier's (its default rule is half of what is left). At least 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from engramctl.tiers.plan import vram_reserve
from engramctl.units import human_bytes

SEQUENCES_VRAM_SHARE = 0.5


@dataclass(frozen=True)
class Gpu:
    """The GPU the layers would go to, as measured now."""

    name: str
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class LayerCost:
    """One block on the device: its weights and the state the context allocates for it."""

    weights_bytes: int
    state_bytes: int  # KV cache cells + recurrent cells of this block


@dataclass(frozen=True)
class ModelCost:
    layers: tuple[LayerCost, ...]  # the blocks, first to last
    output_bytes: int  # the output layer on the GPU: on it only with every block
    input_bytes: int  # the token embedding and any other tensor outside the blocks: always on the CPU
    tied_bytes: int = 0  # of output_bytes, a copy of the token embedding (a tied output): no extra bytes on the CPU

    @property
    def weights_bytes(self) -> int:
        """Every weight once (the GGUF's tensors)."""
        blocks = sum(lay.weights_bytes for lay in self.layers)
        return blocks + self.output_bytes - self.tied_bytes + self.input_bytes

    def cpu_weights_bytes(self, n_gpu_layers: int) -> int:
        """Weights left on the CPU: all but what goes to the GPU, the token embedding always."""
        gpu = self.gpu_bytes(n_gpu_layers)[0]
        return self.weights_bytes - gpu + (self.tied_bytes if n_gpu_layers > len(self.layers) else 0)

    @property
    def state_bytes(self) -> int:
        return sum(lay.state_bytes for lay in self.layers)

    def gpu_bytes(self, n_gpu_layers: int) -> tuple[int, int]:
        """(weights, state) on the GPU with llama.cpp's n_gpu_layers: the last blocks, then the output layer."""
        blocks = self.layers[len(self.layers) - min(n_gpu_layers, len(self.layers)) :] if n_gpu_layers else ()
        weights = sum(lay.weights_bytes for lay in blocks)
        if n_gpu_layers > len(self.layers):
            weights += self.output_bytes
        return weights, sum(lay.state_bytes for lay in blocks)


@dataclass(frozen=True)
class OffloadPlan:
    n_gpu_layers: int  # llama.cpp's model parameter: blocks on the GPU, + 1 with the output layer
    n_layers: int  # every layer: the blocks + the output layer
    gpu: Gpu | None
    weights_gpu_bytes: int
    weights_cpu_bytes: int
    state_gpu_bytes: int
    state_cpu_bytes: int
    reserve_bytes: int
    vram_tier_bytes: int  # claimed ahead of the layers (a budget the user set); 0 under the default rule
    rule: str
    sequences: int = 1
    sequences_rule: str = ""

    @property
    def device(self) -> str:
        return "cuda" if self.n_gpu_layers else "cpu"

    def to_json(self) -> dict[str, Any]:
        gpu = self.gpu
        return {
            "device": self.device,
            "gpu": None if gpu is None else gpu.name,
            "layers_on_gpu": self.n_gpu_layers,
            "layers": self.n_layers,
            "weights_gpu_bytes": self.weights_gpu_bytes,
            "weights_cpu_bytes": self.weights_cpu_bytes,
            "state_gpu_bytes": self.state_gpu_bytes,
            "state_cpu_bytes": self.state_cpu_bytes,
            "reserve_bytes": self.reserve_bytes,
            "vram_tier_bytes": self.vram_tier_bytes,
            "vram_free_bytes": None if gpu is None else gpu.free_bytes,
            "vram_total_bytes": None if gpu is None else gpu.total_bytes,
            "rule": self.rule,
            "sequences": self.sequences,
            "sequences_rule": self.sequences_rule,
        }


def cpu_reason(requested: str, gpu_build: bool, gpu: Gpu | None) -> str | None:
    """Why every layer stays on the CPU before any arithmetic, or None when the GPU can take layers."""
    if requested == "cpu":
        return "--device cpu: every layer on the CPU"
    if not gpu_build:
        return "this llama.cpp build has no GPU support (a CPU build): every layer on the CPU"
    if gpu is None:
        return "this llama.cpp build has GPU support but sees no GPU: every layer on the CPU"
    return None


def plan_offload(
    model: ModelCost,
    gpu: Gpu | None,
    *,
    requested: str = "auto",
    gpu_build: bool = True,
    vram_tier_bytes: int = 0,
    sequences: int = 1,
    sequences_rule: str = "",
) -> OffloadPlan:
    """n_gpu_layers for `model` on `gpu` by the rule in this module's docstring."""
    n_blocks = len(model.layers)
    why = cpu_reason(requested, gpu_build, gpu)
    if why is not None or gpu is None:
        return _plan(model, 0, gpu, 0, 0, why or "", sequences, sequences_rule)
    reserve = vram_reserve(gpu.total_bytes)
    room = gpu.free_bytes - reserve - vram_tier_bytes
    tier = f"VRAM tier {human_bytes(vram_tier_bytes)} (set by the user)" if vram_tier_bytes else ""
    w_all, s_all = model.gpu_bytes(n_blocks + 1)
    need = w_all + s_all + reserve + vram_tier_bytes
    arithmetic = (
        f"weights {human_bytes(w_all)} + state {human_bytes(s_all)} + reserve {human_bytes(reserve)} "
        f"(max(1 GiB, 10% of {human_bytes(gpu.total_bytes)}))"
        + (f" + {tier}" if tier else "")
        + f" = {human_bytes(need)}"
    )
    if w_all + s_all <= room:
        rule = (
            f"every layer on the GPU: {arithmetic} <= free VRAM {human_bytes(gpu.free_bytes)}; "
            f"the token embedding ({human_bytes(model.input_bytes)}) stays on the CPU, as llama.cpp keeps it"
        )
        return _plan(model, n_blocks + 1, gpu, reserve, vram_tier_bytes, rule, sequences, sequences_rule)
    k, used = 0, 0
    for lay in reversed(model.layers):  # llama.cpp offloads the last blocks first
        cost = lay.weights_bytes + lay.state_bytes
        if used + cost > room:
            break
        k, used = k + 1, used + cost
    rule = (
        f"{k} of {n_blocks + 1} layers on the GPU: every layer would need {arithmetic} > free VRAM "
        f"{human_bytes(gpu.free_bytes)}; the last {k} blocks take {human_bytes(used)} <= free VRAM - reserve"
        f"{' - ' + tier if tier else ''} = {human_bytes(max(0, room))}; "
        "the rest runs on the CPU (layers come before the VRAM tier)"
    )
    return _plan(model, k, gpu, reserve, vram_tier_bytes, rule, sequences, sequences_rule)


def _plan(
    model: ModelCost, n: int, gpu: Gpu | None, reserve: int, tier: int, rule: str, seqs: int, seqs_rule: str
) -> OffloadPlan:
    w_gpu, s_gpu = model.gpu_bytes(n)
    return OffloadPlan(
        n_gpu_layers=n,
        n_layers=len(model.layers) + 1,
        gpu=gpu,
        weights_gpu_bytes=w_gpu,
        weights_cpu_bytes=model.cpu_weights_bytes(n),
        state_gpu_bytes=s_gpu,
        state_cpu_bytes=model.state_bytes - s_gpu,
        reserve_bytes=reserve,
        vram_tier_bytes=tier,
        rule=rule,
        sequences=seqs,
        sequences_rule=seqs_rule,
    )


def gpu_sequences(gpu: Gpu, weights_bytes: int, state_bytes: Callable[[int], int], cap: int) -> tuple[int, str]:
    """Conversations served at once on `gpu` when the user sets none, and the rule in words: the most, up to
    `cap`, whose device state (`state_bytes(n)`: KV + recurrent cells of a context serving n, every block on
    the GPU) takes at most SEQUENCES_VRAM_SHARE of free VRAM - every weight - the reserve; at least 1."""
    reserve = vram_reserve(gpu.total_bytes)
    room = gpu.free_bytes - weights_bytes - reserve
    share = int(SEQUENCES_VRAM_SHARE * max(0, room))
    n = next((n for n in range(cap, 0, -1) if state_bytes(n) <= share), 1)
    rule = (
        f"{n} at once: the most (up to {cap}) whose state ({human_bytes(state_bytes(n))} for {n}) fits in "
        f"{SEQUENCES_VRAM_SHARE:.0%} of (free VRAM {human_bytes(gpu.free_bytes)} - weights "
        f"{human_bytes(weights_bytes)} - reserve {human_bytes(reserve)}) = {human_bytes(share)}"
    )
    if state_bytes(n) > share:
        rule += "; not even one does, so one at a time"
    return n, rule
