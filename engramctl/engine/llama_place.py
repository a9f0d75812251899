"""Where each tensor of a llama.cpp state blob lies (plan), and a blob laid out in place for a reader to fill
(place: store/reader.py reads a snapshot from disk straight into it, so a restore loads it with no copy between).
The blob's format is llama_state.py's docstring."""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np

from engramctl.engine.llama_format import _GGML_IDS, GGML_TYPES, MAGIC, SEQ_ID, BlobLayout, _cells, _numel

Span = tuple[int, int]  # (offset, bytes) in a blob


def plan(
    layout: BlobLayout, n_tokens: int, types: dict[tuple[int, str], int]
) -> tuple[int, list[tuple[int, bytes]], dict[tuple[int, str], Span]]:
    """The blob of `n_tokens` tokens whose tensors have these ggml types ({(layer, "keys" | "values" | "conv" |
    "recurrent"): type id}): (its size, its headers as (offset, bytes), where each tensor's bytes go). A
    recurrent layer without a conv or SSM state still has its header, over no bytes."""
    heads: list[tuple[int, bytes]] = []
    spans: dict[tuple[int, str], Span] = {}
    at = 0

    def head(b: bytes) -> None:
        nonlocal at
        heads.append((at, b))
        at += len(b)

    def data(key: tuple[int, str], n: int) -> None:
        nonlocal at
        spans[key] = (at, n)
        at += n

    head(struct.pack("<Ii", MAGIC, SEQ_ID))
    if layout.has_kv:
        attn = [i for i, lay in enumerate(layout.layers) if lay.attention]
        head(struct.pack("<II", 1, n_tokens) + _cells(n_tokens).tobytes())
        head(struct.pack("<II", int(layout.v_trans), len(attn)))
        for i in attn:
            item = GGML_TYPES[types[(i, "keys")]].itemsize
            head(struct.pack("<iQ", types[(i, "keys")], layout.layers[i].k_elems * item))
            data((i, "keys"), n_tokens * layout.layers[i].k_elems * item)
        for i in attn:
            t, elems = types[(i, "values")], layout.layers[i].v_elems
            item = GGML_TYPES[t].itemsize
            head(struct.pack("<iII", t, item, elems) if layout.v_trans else struct.pack("<iQ", t, elems * item))
            data((i, "values"), n_tokens * elems * item)
    if layout.has_recurrent:
        recr = [i for i, lay in enumerate(layout.layers) if lay.recurrent]
        head(struct.pack("<IiIII", 1, n_tokens - 1, 0, 0, len(layout.layers)))
        for name, shape_of in (("conv", lambda lay: lay.conv_shape), ("recurrent", lambda lay: lay.ssm_shape)):
            for i in recr:
                t = types.get((i, name), _GGML_IDS["float32"])
                n = _numel(shape_of(layout.layers[i])) * GGML_TYPES[t].itemsize
                head(struct.pack("<iQ", t, n))
                data((i, name), n)
    return at, heads, spans


def place(
    layout: BlobLayout,
    n_tokens: int,
    entries: dict[str, tuple[str, tuple[int, ...]]],
    slack_bytes: int = 0,
    take: Callable[[int], np.ndarray] | None = None,
) -> dict | None:
    """A blob for a stored state of `n_tokens` tokens whose payload tensors are `entries` ({"layers.i.name":
    (safetensors dtype code, shape)}), its headers written: {payload name: the uint8 view of the blob where that
    tensor's bytes go} (store/reader.py's Placer), for a reader to fill. None when the entries are not exactly
    what this layout's blob holds (the state layer then says what does not match). Transposed values are not
    token-major in the blob: they are left to serialize(). `slack_bytes` more are allocated after the blob
    (llama_streams.as_streams: the empty entries of a context of several KV streams, written there, not copied).
    `take(nbytes)` gives the memory (llama_buffers.HostBuffers: reused, already faulted in), else a new array."""
    codes = {"F16": _GGML_IDS["float16"], "F32": _GGML_IDS["float32"]}
    types: dict[tuple[int, str], int] = {}
    names: dict[tuple[int, str], str] = {}
    for i, lay in enumerate(layout.layers):
        want = {}
        if lay.attention:
            want["keys"], want["values"] = (1, n_tokens, lay.k_elems), (1, n_tokens, lay.v_elems)
        if lay.recurrent:
            want["conv"], want["recurrent"] = (1, *lay.conv_shape), (1, *lay.ssm_shape)
        for name, shape in want.items():
            key = f"layers.{i}.{name}"
            entry = entries.get(key)
            if entry is None and name in ("conv", "recurrent") and _numel(shape) == 0:
                continue  # parse() gives no tensor for an empty state
            if entry is None or entry[0] not in codes or tuple(entry[1]) != shape:
                return None
            types[(i, name)], names[(i, name)] = codes[entry[0]], key
    layer_keys = {k for k in entries if k.startswith("layers.")}
    if layer_keys != set(names.values()):
        return None
    size, heads, spans = plan(layout, n_tokens, types)
    blob = take(size + slack_bytes) if take is not None else np.empty(size + slack_bytes, np.uint8)
    for at, head in heads:
        blob[at : at + len(head)] = np.frombuffer(head, np.uint8)
    out = {}
    for key, name in names.items():
        at, n = spans[key]
        if not (layout.v_trans and key[1] == "values"):
            out[name] = blob[at : at + n]
    return out
