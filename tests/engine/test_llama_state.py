"""llama.cpp's state blob <-> typed per-layer tensors: for every architecture the backend serves, the
blob parses into per-layer conv/SSM and K/V tensors and re-serializes byte for byte; anything the
parser does not expect is a typed error, never a guess."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from engramctl.engine import llama_format, llama_place, llama_state
from engramctl.errors import StateFormatError
from engramctl.state import AttentionState, HybridState, RecurrentState
from engramctl.store import arrays
from tests.gguf_factory import LLAMA_FAMILIES

N = 23


@pytest.fixture(scope="module")
def blobs(gguf_zoo, load_llama):
    ids = torch.randint(3, 512, (N,), generator=torch.Generator().manual_seed(11)).tolist()
    out = {}
    for fam in LLAMA_FAMILIES:
        backend = load_llama(gguf_zoo.path(fam))
        backend.prefill(backend.new_live(), ids)
        out[fam] = (backend, backend._get_blob())
    return out


@pytest.mark.parametrize("family", LLAMA_FAMILIES)
def test_blob_parses_into_typed_layers_and_reserializes_byte_for_byte(blobs, family):
    backend, blob = blobs[family]
    layers = llama_state.parse(blob, backend.layout, N)
    again = llama_state.serialize(layers, backend.layout, N)  # views of `blob` where it keeps them: blob itself
    assert np.frombuffer(again, np.uint8).ctypes.data == np.frombuffer(blob, np.uint8).ctypes.data
    copies = [_copied(layer) for layer in layers]  # elsewhere in memory: serialized into a new blob
    assert bytes(llama_state.serialize(copies, backend.layout, N)) == bytes(blob)
    kinds = [layer.kind for layer in layers]
    assert kinds == list(backend.spec.layout) and ("recurrent" in kinds or "hybrid" in kinds)
    for layer in layers:
        att = layer.attention if isinstance(layer, HybridState) else layer
        rec = layer.recurrent if isinstance(layer, HybridState) else layer
        if isinstance(att, AttentionState):
            assert (
                att.keys.shape[:2] == (1, N) and arrays.dtype_name(att.keys) == "float16"
            )  # (1, tokens, kv_heads*head_dim)
            assert att.n_tokens == N
        if isinstance(rec, RecurrentState):
            assert rec.conv is not None and arrays.dtype_name(rec.conv) == "float32" and abs(rec.conv).sum() > 0


def _copied(layer):
    return type(layer).from_tensors({k: v.copy() for k, v in layer.tensors().items()}) if layer.tensors() else layer


_HYBRID = llama_state.BlobLayout(
    (
        llama_format.LayerLayout("recurrent", conv_shape=(6, 3), ssm_shape=(2, 4, 5)),
        llama_format.LayerLayout("attention", k_elems=8, v_elems=8),
        llama_format.LayerLayout("hybrid", k_elems=4, v_elems=6, conv_shape=(6, 3), ssm_shape=(2, 4, 5)),
        llama_format.LayerLayout("recurrent", conv_shape=(0,), ssm_shape=(2, 4, 5)),
    )
)


def _layers(layout, n, seed=0):
    g = np.random.default_rng(seed)
    out = []
    for lay in layout.layers:
        rec = att = None
        if lay.recurrent:
            conv = g.standard_normal((1, *lay.conv_shape)).astype(np.float32) if lay.conv_shape != (0,) else None
            rec = RecurrentState(conv=conv, recurrent=g.standard_normal((1, *lay.ssm_shape)).astype(np.float32))
        if lay.attention:
            att = AttentionState(
                keys=g.standard_normal((1, n, lay.k_elems)).astype(np.float16),
                values=g.standard_normal((1, n, lay.v_elems)).astype(np.float16),
            )
        out.append(HybridState(rec, att) if rec and att else rec or att)
    return out


def test_a_state_read_into_place_is_its_blob_with_nothing_copied():
    """llama_place.place lays a stored state's tensors out as the blob set_data takes; filled with their bytes
    (what store/reader.py does from disk), serialize() finds them in place and returns that buffer, byte for byte
    the blob of the same layers serialized by copying. Anything else is not placed."""
    n = 19
    layers = _layers(_HYBRID, n)
    want = bytes(llama_state.serialize(layers, _HYBRID, n))
    names = {f"layers.{i}.{k}": t for i, layer in enumerate(layers) for k, t in layer.tensors().items()}
    code = {"float16": "F16", "float32": "F32"}
    entries = {k: (code[t.dtype.name], t.shape) for k, t in names.items()}
    views = llama_place.place(_HYBRID, n, {**entries, "token_ids": ("I64", (n,)), "last_logits": ("F32", (7,))})
    assert views is not None and views.keys() == names.keys()  # the rest is not the blob's
    for k, v in views.items():
        v[:] = np.frombuffer(names[k].tobytes(), np.uint8)
    placed = [
        type(layer).from_tensors(
            {k: views[f"layers.{i}.{k}"].view(t.dtype).reshape(t.shape) for k, t in layer.tensors().items()}
        )
        for i, layer in enumerate(layers)
    ]
    blob = llama_state.serialize(placed, _HYBRID, n)
    base = next(iter(views.values())).base
    assert np.frombuffer(blob, np.uint8).ctypes.data == base.ctypes.data and bytes(blob) == want
    wrong = dict(entries, **{"layers.1.keys": ("F16", (1, n + 1, 8))})
    assert llama_place.place(_HYBRID, n, wrong) is None
    assert llama_place.place(_HYBRID, n, {**entries, "layers.9.keys": ("F16", (1, n, 8))}) is None
    transposed = llama_state.BlobLayout(_HYBRID.layers, v_trans=True)
    views = llama_place.place(transposed, n, entries)
    assert views is not None and not any(k.endswith("values") for k in views)


def _corrupt(blob: bytearray, at: int, fmt: str, value) -> bytearray:
    bad = bytearray(blob)
    struct.pack_into(fmt, bad, at, value)
    return bad


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda b: _corrupt(b, 0, "<I", 0xDEADBEEF), "magic"),
        (lambda b: _corrupt(b, 4, "<i", 3), "sequence id"),
        (lambda b: _corrupt(b, 8, "<I", 2), "stream count"),
        (lambda b: _corrupt(b, 16, "<i", 5), r"KV cell 0 = \(5, 1, 0\)"),  # first KV cell claims position 5
        (lambda b: b + b"\0", "after its last known field"),
        (lambda b: b[:-3], "ends inside"),
    ],
)
def test_an_unexpected_blob_is_a_typed_error(blobs, mutate, match):
    backend, blob = blobs["granitemoehybrid"]
    with pytest.raises(StateFormatError, match=match):
        llama_state.parse(mutate(bytearray(blob)), backend.layout, N)


def test_a_wrong_token_count_is_refused(blobs):
    backend, blob = blobs["mamba2"]  # a recurrent cell records the last position: N - 1
    with pytest.raises(StateFormatError, match="recurrent cell position"):
        llama_state.parse(blob, backend.layout, N + 1)


@pytest.mark.parametrize("family", LLAMA_FAMILIES)
def test_cells_a_batch_left_out_of_order_are_sorted_back_to_the_blob_of_the_same_state_alone(blobs, family):
    """A sequence that shared the context holds its cells wherever they were free; llama.cpp writes them in
    cell order. Sorted by position (with their K and V rows), the blob is the in-order one, byte for byte."""
    backend, blob = blobs[family]
    layout = backend.layout
    if not layout.has_kv:
        pytest.skip("no KV cells")
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(5))
    shuffled_layers = []
    for layer in llama_state.parse(blob, layout, N):
        att = layer.attention if isinstance(layer, HybridState) else layer
        if isinstance(att, AttentionState):
            p = perm.numpy()  # llama.cpp's arrays are numpy
            att = AttentionState(keys=att.keys[:, p].copy(), values=att.values[:, p].copy())
            layer = HybridState(layer.recurrent, att) if isinstance(layer, HybridState) else att
        shuffled_layers.append(layer)
    shuffled = llama_state.serialize(shuffled_layers, layout, N)
    cells = llama_state.np.frombuffer(shuffled, dtype=llama_state._CELL, count=N, offset=16)
    cells["pos"] = perm.numpy()  # cell i holds position perm[i], with that position's rows
    assert bytes(shuffled) != bytes(blob)
    assert bytes(llama_state.in_position_order(shuffled, layout, N)) == bytes(blob)
    assert llama_state.in_position_order(blob, layout, N) is blob  # in order already: no copy
