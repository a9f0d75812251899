"""llama.cpp's state blob <-> typed per-layer tensors: for every architecture the backend serves, the
blob parses into per-layer conv/SSM and K/V tensors and re-serializes byte for byte; anything the
parser does not expect is a typed error, never a guess."""

from __future__ import annotations

import struct

import pytest
import torch

from engramctl.engine import llama_state
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
    assert bytes(llama_state.serialize(layers, backend.layout, N)) == bytes(blob)
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
