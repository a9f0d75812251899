"""Which layers of a GGUF model keep which state in llama.cpp, and the shape of each, from its metadata.

The rules mirror llama.cpp 0.3.36 (src/models/<arch>.cpp set is_recr_impl; src/llama-model.cpp picks
the hybrid memory's layer filters); the state shapes mirror the graph code's reshapes
(src/models/mamba-base.cpp, qwen3next.cpp, lfm2.cpp). They are checked, not trusted: the backend
round-trips a real state blob through this layout when it loads a model and refuses it on any mismatch.
"""

from __future__ import annotations

from engramctl.engine.gguf_header import GgufHeader
from engramctl.engine.llama_format import BlobLayout, LayerLayout
from engramctl.errors import UnsupportedModel

MAMBA1 = {"mamba", "jamba"}  # SSM state (d_inner, d_state)
MAMBA2 = {"mamba2", "granitehybrid", "nemotron_h", "falcon-h1", "qwen3next"}  # (heads, head_dim, d_state)
RECURRENT_ARCHS = MAMBA1 | MAMBA2 | {"lfm2"}
# Recurrent or hybrid architectures llama.cpp knows but engramctl has not verified: refused by name.
_UNVERIFIED = {
    "rwkv6",
    "rwkv6qwen2",
    "rwkv7",
    "arwkv7",
    "plamo2",
    "kimi-linear",
    "lfm2moe",
    "nemotron_h_moe",
    "qwen35",
    "qwen35moe",
    "minimax-01",
}


def _per_layer(header: GgufHeader, key: str, n_layer: int, default=None) -> list:
    value = header.arch_value(key, default)
    if value is None:
        raise UnsupportedModel(f"GGUF file {header.path.name} lacks {header.architecture}.{key}.")
    return list(value) if isinstance(value, list) else [value] * n_layer


def layer_kinds(header: GgufHeader) -> list[str]:
    arch = header.architecture
    n_layer = int(header.arch_value("block_count", 0))
    if n_layer <= 0:
        raise UnsupportedModel(f"GGUF file {header.path.name} has no {arch}.block_count.")
    if arch in _UNVERIFIED:
        raise UnsupportedModel(
            f"GGUF architecture {arch!r} keeps recurrent state whose layout engramctl has not verified; "
            f"supported recurrent architectures: {', '.join(sorted(RECURRENT_ARCHS))}."
        )
    if header.arch_value("attention.sliding_window") is not None:
        raise UnsupportedModel(
            f"GGUF architecture {arch!r} uses sliding-window attention, whose cache drops old "
            "tokens; engramctl cannot snapshot it exactly yet."
        )
    if arch in ("mamba", "mamba2"):
        return ["recurrent"] * n_layer
    if arch == "falcon-h1":  # attention and Mamba2 side by side in every layer
        return ["hybrid"] * n_layer
    kv = _per_layer(header, "attention.head_count_kv", n_layer)
    if arch == "nemotron_h":  # M = no heads and no FFN, * = heads and no FFN, - = FFN only
        ff = _per_layer(header, "feed_forward_length", n_layer)
        return ["recurrent" if not k and not f else "attention" if not f else "empty" for k, f in zip(kv, ff)]
    if arch == "qwen3next":
        recurrent = header.arch_value("attention.recurrent_layers")
        if not isinstance(recurrent, list):
            every = int(header.arch_value("full_attention_interval", 4))
            recurrent = [(i + 1) % every != 0 for i in range(n_layer)]
        return ["recurrent" if r else "attention" for r in recurrent]
    if arch in ("granitehybrid", "jamba", "lfm2"):
        return ["recurrent" if not k else "attention" for k in kv]
    return ["attention"] * n_layer  # plain transformers (llama, qwen2, ...): verified by the round trip


def blob_layout(header: GgufHeader, v_trans: bool) -> BlobLayout:
    """Per-layer kinds and state shapes for `header`'s model."""
    arch = header.architecture
    kinds = layer_kinds(header)
    n_layer = len(kinds)
    n_embd = int(header.arch_value("embedding_length", 0))
    heads = _per_layer(header, "attention.head_count", n_layer, 0)
    kv_heads = _per_layer(header, "attention.head_count_kv", n_layer, 0)
    conv_shape: tuple[int, ...] = (0,)
    ssm_shape: tuple[int, ...] = (0,)
    if any(k in ("recurrent", "hybrid") for k in kinds):
        if arch == "lfm2":  # short convolution only: conv window (n_embd, l_cache - 1), no SSM
            conv_shape = (n_embd, int(header.arch_value("shortconv.l_cache")) - 1)
        else:
            d_conv = int(header.arch_value("ssm.conv_kernel"))
            d_inner = int(header.arch_value("ssm.inner_size"))
            d_state = int(header.arch_value("ssm.state_size"))
            n_group = int(header.arch_value("ssm.group_count", 0))
            conv_shape = (d_inner + 2 * n_group * d_state, d_conv - 1)
            if arch in MAMBA1:
                ssm_shape = (d_inner, d_state)
            else:
                n_head = int(header.arch_value("ssm.time_step_rank"))
                ssm_shape = (n_head, d_inner // n_head, d_state)
    layers = []
    for i, kind in enumerate(kinds):
        k_elems = v_elems = 0
        if kind in ("attention", "hybrid"):
            head_dim = n_embd // heads[i] if heads[i] else 0
            k_elems = kv_heads[i] * int(header.arch_value("attention.key_length", head_dim))
            v_elems = kv_heads[i] * int(header.arch_value("attention.value_length", head_dim))
        rec = kind in ("recurrent", "hybrid")
        layers.append(LayerLayout(kind, k_elems, v_elems, conv_shape if rec else (0,), ssm_shape if rec else (0,)))
    return BlobLayout(tuple(layers), v_trans)
