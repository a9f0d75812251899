"""The layout of llama.cpp's per-sequence state blob, as engramctl parses and lays it out: the format's
constants, which layers hold what (LayerLayout, BlobLayout), and the KV cells a sequence's blob lists.
The format itself is described in llama_state.py (parse, serialize) and llama_place.py (plan, place)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAGIC = 0xAF143CD8
SEQ_ID = 0  # the sequence a blob names here; llama.cpp writes the one it came from (renumber) and ignores it on load
# ggml types a state may hold. Not bf16 (ggml type 30): numpy has no such type, and this backend's KV cache is
# f16 and its recurrent states f32 (llama_context.py sets no other cache type).
GGML_TYPES = {0: np.dtype(np.float32), 1: np.dtype(np.float16)}
_GGML_IDS = {v.name: k for k, v in GGML_TYPES.items()}


@dataclass(frozen=True)
class LayerLayout:
    kind: str  # "empty" | "recurrent" | "attention" | "hybrid"
    k_elems: int = 0  # per token: kv_heads * key_length
    v_elems: int = 0
    conv_shape: tuple[int, ...] = (0,)  # (channels, d_conv - 1); (0,) when the layer has none
    ssm_shape: tuple[int, ...] = (0,)  # Mamba2 (heads, head_dim, d_state), Mamba1 (d_inner, d_state); (0,) when none

    @property
    def attention(self) -> bool:
        return self.kind in ("attention", "hybrid")

    @property
    def recurrent(self) -> bool:
        return self.kind in ("recurrent", "hybrid")


@dataclass(frozen=True)
class BlobLayout:
    layers: tuple[LayerLayout, ...]
    v_trans: bool = False  # llama.cpp stores V transposed unless flash attention is on

    @property
    def has_kv(self) -> bool:
        return any(lay.attention for lay in self.layers)

    @property
    def has_recurrent(self) -> bool:
        return any(lay.recurrent for lay in self.layers)


_CELL = np.dtype([("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])


def _cells(n_tokens: int) -> np.ndarray:
    cells = np.empty(n_tokens, dtype=_CELL)
    cells["pos"], cells["n_seq"], cells["seq"] = np.arange(n_tokens), 1, SEQ_ID
    return cells


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
