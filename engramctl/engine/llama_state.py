"""llama.cpp's per-sequence state blob <-> typed per-layer tensors (attention K/V, recurrent conv/SSM).

The blob is what llama_state_seq_get_data writes for one sequence with flags 0 (llama.cpp 0.3.36 =
LLAMA_STATE_SEQ_VERSION 3; src/llama-context.cpp, llama-kv-cache.cpp, llama-memory-recurrent.cpp,
llama-memory-hybrid.cpp):

    u32 magic 0xaf143cd8 | i32 seq_id
    attention part (models with a KV cache; a hybrid writes it first):
      u32 n_stream (1) | u32 cells (= tokens) | per cell: i32 pos, u32 n_seq_id (1), i32 seq_id
      u32 v_trans | u32 n_kv_layers
      per KV layer: i32 k_type | u64 k_row_bytes | tokens x k_row        (a row = one token, all heads)
      per KV layer: i32 v_type | u64 v_row_bytes | tokens x v_row        (v_trans = 0)
                 or i32 v_type | u32 v_elem_bytes | u32 v_elems | v_elems x tokens   (v_trans = 1)
    recurrent part (models with recurrent layers):
      u32 cells (1) | i32 pos (= tokens - 1) | u32 n_seq_id (0) | u32 s_trans (0) | u32 n_layers (all)
      per recurrent layer: i32 r_type | u64 r_row_bytes | conv state
      per recurrent layer: i32 s_type | u64 s_row_bytes | SSM state

Every header field is regenerated from the layout and the token count, so parse() checks each one and
serialize(parse(blob)) reproduces the blob byte for byte; anything unexpected (a second stream, holes
in the positions, another element type, bytes left over) raises StateFormatError instead of guessing.
Arrays returned by parse() are numpy arrays, zero-copy views of the blob (which must not be modified
afterwards), but for transposed values (V without flash attention), which are copied to token-major order.
serialize() takes arrays of either kind (store/arrays.py).
"""

from __future__ import annotations

import struct

import numpy as np

from engramctl.engine.llama_format import (
    _CELL,
    _GGML_IDS,
    GGML_TYPES,
    MAGIC,
    SEQ_ID,
    BlobLayout,
    _cells,
    _numel,
)
from engramctl.engine.llama_place import Span, plan
from engramctl.errors import StateFormatError
from engramctl.state import AttentionState, EmptyState, HybridState, RecurrentState
from engramctl.state.layers import LayerState
from engramctl.store import arrays


class _Reader:
    def __init__(self, blob: bytearray):
        self.blob, self.pos = blob, 0

    def take(self, fmt: str, what: str):
        if self.pos + struct.calcsize(fmt) > len(self.blob):
            raise StateFormatError(f"llama.cpp state blob ends inside {what} at byte {self.pos}.")
        (value,) = struct.unpack_from(fmt, self.blob, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def expect(self, fmt: str, want: int, what: str) -> None:
        got = self.take(fmt, what)
        if got != want:
            raise StateFormatError(f"llama.cpp state blob has {what} = {got} at byte {self.pos}; expected {want}.")

    def tensor(self, shape: tuple[int, ...], type_id: int, what: str) -> np.ndarray:
        dtype = GGML_TYPES.get(type_id)
        if dtype is None:
            raise StateFormatError(
                f"llama.cpp state blob holds {what} as ggml type {type_id}; only f32/f16 are parsed."
            )
        n = _numel(shape)
        size = n * dtype.itemsize
        if self.pos + size > len(self.blob):
            raise StateFormatError(f"llama.cpp state blob ends inside {what}.")
        t = np.frombuffer(self.blob, dtype=dtype, count=n, offset=self.pos).reshape(shape)  # a view, writable
        self.pos += size
        return t

    def cells(self, n_tokens: int) -> None:
        """The KV cells: positions 0..n-1 in order, each in one sequence, ours (checked vectorized:
        a 32k-token state has 32k of them)."""
        size = n_tokens * _CELL.itemsize
        if self.pos + size > len(self.blob):
            raise StateFormatError(f"llama.cpp state blob ends inside its KV cells at byte {self.pos}.")
        got = np.frombuffer(self.blob, dtype=_CELL, count=n_tokens, offset=self.pos)
        want = _cells(n_tokens)
        if not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0])
            raise StateFormatError(
                f"llama.cpp state blob has KV cell {bad} = {got[bad].tolist()} (position, sequence "
                f"count, sequence id); expected {want[bad].tolist()}: not one sequence in order."
            )
        self.pos += size

    def rows(self, shape: tuple[int, ...], row_elems: int, what: str) -> np.ndarray:
        """i32 type | u64 row bytes | data; the row size must be what `row_elems` of that type take."""
        type_id = self.take("<i", f"{what} type")
        dtype = GGML_TYPES.get(type_id)
        want_row = row_elems * (dtype.itemsize if dtype is not None else 0)
        self.expect("<Q", want_row, f"{what} row bytes")
        return self.tensor(shape, type_id, what)


def renumber(blob: bytearray, has_kv: bool) -> bytearray:
    """`blob` (in place) as if it came from sequence SEQ_ID: llama.cpp writes the sequence it was taken from
    into the header and into every KV cell, and reads neither back (set_data loads into the sequence it is
    given), so a conversation's state has the same bytes whichever sequence of the context it ran in."""
    struct.pack_into("<i", blob, 4, SEQ_ID)
    if has_kv and len(blob) >= 16:
        n_stream, n_cells = struct.unpack_from("<II", blob, 8)
        if n_stream == 1 and 16 + n_cells * _CELL.itemsize <= len(blob):
            np.frombuffer(blob, dtype=_CELL, count=n_cells, offset=16)["seq"] = SEQ_ID  # parse() checks the rest
    return blob


def in_position_order(blob: bytearray, layout: BlobLayout, n_tokens: int) -> bytearray:
    """`blob` with its KV cells (and every layer's K and V rows with them) sorted by position: a new blob
    when they were not in order, else `blob` itself. A sequence that shared the context with others holds
    its cells wherever they were free (a released sequence's cells are reused), and llama.cpp writes them
    in cell order; sorted, the blob is the one a fresh process holding the same state writes, so a state
    captured mid-batch has the bytes of the same state captured alone. Anything unexpected is left as it
    is, for parse() to refuse."""
    if not layout.has_kv or len(blob) < 16 + n_tokens * _CELL.itemsize:
        return blob
    n_stream, n_cells = struct.unpack_from("<II", blob, 8)
    if n_stream != 1 or n_cells != n_tokens:
        return blob
    cells = np.frombuffer(blob, dtype=_CELL, count=n_tokens, offset=16)
    if (np.diff(cells["pos"]) > 0).all():  # every capture passes here: one O(n) look, no sort, when in order
        return blob
    order = np.argsort(cells["pos"], kind="stable")
    out = bytearray(blob)
    view = np.frombuffer(out, dtype=np.uint8)
    at = 16
    view[at : at + cells.nbytes] = np.frombuffer(cells[order].tobytes(), dtype=np.uint8)
    at += cells.nbytes
    v_trans, n_layers = struct.unpack_from("<II", blob, at)
    at += 8
    src = np.frombuffer(blob, dtype=np.uint8)
    # each layer's keys, then each layer's values: i32 type | u64 row bytes | (tokens, row bytes), or for
    # transposed values i32 type | u32 element bytes | u32 elements | (elements, tokens, element bytes)
    for transposed in [False] * n_layers + [bool(v_trans)] * n_layers:
        if transposed:
            elem_bytes, elems = struct.unpack_from("<II", blob, at + 4)
            shape = (elems, n_tokens, elem_bytes)
        else:
            (row,) = struct.unpack_from("<Q", blob, at + 4)
            shape = (1, n_tokens, row)
        at += 12
        size = shape[0] * shape[1] * shape[2]
        view[at : at + size] = src[at : at + size].reshape(shape)[:, order].reshape(-1)
        at += size
    return out


def parse(blob: bytearray, layout: BlobLayout, n_tokens: int) -> list[LayerState]:
    r = _Reader(blob)
    r.expect("<I", MAGIC, "magic")
    r.expect("<i", SEQ_ID, "sequence id")
    keys: dict[int, np.ndarray] = {}
    values: dict[int, np.ndarray] = {}
    if layout.has_kv:
        attn = [i for i, lay in enumerate(layout.layers) if lay.attention]
        r.expect("<I", 1, "stream count")
        r.expect("<I", n_tokens, "KV cell count")
        r.cells(n_tokens)
        r.expect("<I", int(layout.v_trans), "V transposition")
        r.expect("<I", len(attn), "KV layer count")
        for i in attn:
            keys[i] = r.rows((1, n_tokens, layout.layers[i].k_elems), layout.layers[i].k_elems, f"layer {i} keys")
        for i in attn:
            lay = layout.layers[i]
            if not layout.v_trans:
                values[i] = r.rows((1, n_tokens, lay.v_elems), lay.v_elems, f"layer {i} values")
                continue
            type_id = r.take("<i", f"layer {i} values type")
            r.expect("<I", GGML_TYPES.get(type_id, np.dtype(np.uint8)).itemsize, "V element bytes")
            r.expect("<I", lay.v_elems, "V elements")
            # stored (elements, tokens): present it token-major like the keys
            values[i] = np.ascontiguousarray(r.tensor((lay.v_elems, n_tokens), type_id, f"layer {i} values").T[None])
    convs: dict[int, np.ndarray] = {}
    ssms: dict[int, np.ndarray] = {}
    if layout.has_recurrent:
        recr = [i for i, lay in enumerate(layout.layers) if lay.recurrent]
        r.expect("<I", 1, "recurrent cell count")
        r.expect("<i", n_tokens - 1, "recurrent cell position")
        r.expect("<I", 0, "recurrent cell sequence count")
        r.expect("<I", 0, "S transposition")
        r.expect("<I", len(layout.layers), "layer count")
        for i in recr:
            shape = layout.layers[i].conv_shape
            convs[i] = r.rows((1, *shape), _numel(shape), f"layer {i} conv state")
        for i in recr:
            shape = layout.layers[i].ssm_shape
            ssms[i] = r.rows((1, *shape), _numel(shape), f"layer {i} SSM state")
    if r.pos != len(blob):
        raise StateFormatError(f"llama.cpp state blob has {len(blob) - r.pos} bytes after its last known field.")
    out: list[LayerState] = []
    for i, lay in enumerate(layout.layers):
        rec = (
            RecurrentState(conv=_none_if_empty(convs[i]), recurrent=_none_if_empty(ssms[i])) if lay.recurrent else None
        )
        att = AttentionState(keys=keys[i], values=values[i]) if lay.attention else None
        out.append(HybridState(rec, att) if rec and att else rec or att or EmptyState())
    return out


def serialize(
    layers: list[LayerState] | tuple[LayerState, ...], layout: BlobLayout, n_tokens: int, *, reuse: bool = True
) -> bytearray:
    """The blob llama_state_seq_set_data takes for these layers: parse()'s exact inverse. When every tensor
    already lies where the blob keeps it (`in_place`), that buffer is the blob, nothing copied (reuse=False: a new
    blob all the same)."""
    tensors = _layer_tensors(layers, layout)
    size, heads, spans = plan(layout, n_tokens, {key: _ggml_id(t) for key, t in tensors.items()})
    found = _in_place(tensors, spans, size, layout.v_trans, heads) if reuse else None
    if found is not None:
        return found
    blob = bytearray(size)
    view = memoryview(blob)
    for key, t in tensors.items():
        at, n = spans[key]
        if n:
            view[at : at + n] = arrays.host_bytes(_transposed(t) if layout.v_trans and key[1] == "values" else t)
    for at, head in heads:
        view[at : at + len(head)] = head
    return blob


def in_place(layers: list[LayerState] | tuple[LayerState, ...], layout: BlobLayout, n_tokens: int):
    """The one buffer in which every tensor of `layers` already lies where their blob keeps it, its headers already
    that blob's (a restore read into llama_place.place(), or a capture's views of its blob): the blob itself, to
    load as it lies; None when they are anywhere else."""
    tensors = _layer_tensors(layers, layout)
    size, heads, spans = plan(layout, n_tokens, {key: _ggml_id(t) for key, t in tensors.items()})
    return _in_place(tensors, spans, size, layout.v_trans, heads)


def _layer_tensors(layers, layout: BlobLayout) -> dict[tuple[int, str], object]:
    """{(layer, name): array} of what a blob holds, a missing conv or SSM state as zeros (parse(): empty)."""
    out: dict[tuple[int, str], object] = {}
    for i, lay in enumerate(layout.layers):
        if lay.attention:
            att = _attention(layers[i])
            out[(i, "keys")], out[(i, "values")] = att.keys, att.values
    for i, lay in enumerate(layout.layers):
        if lay.recurrent:
            rec = _recurrent(layers[i])
            out[(i, "conv")] = np.zeros((1, *lay.conv_shape), np.float32) if rec.conv is None else rec.conv
            out[(i, "recurrent")] = (
                np.zeros((1, *lay.ssm_shape), np.float32) if rec.recurrent is None else rec.recurrent
            )
    return out


def _in_place(tensors: dict, spans: dict[tuple[int, str], Span], size: int, v_trans: bool, heads: list):
    """The one buffer of `size` bytes in which every tensor already lies at its span and the headers are already
    `heads` (a bytearray, or a uint8 array over it), else None."""
    root = None
    base = None
    for key, t in tensors.items():
        at, n = spans[key]
        if n == 0:
            continue
        if not arrays.is_numpy(t) or not t.flags.c_contiguous or t.nbytes != n or (v_trans and key[1] == "values"):
            return None
        if base is None:
            root = t
            while isinstance(root, np.ndarray) and root.base is not None:
                root = root.base
            if isinstance(root, memoryview) and isinstance(root.obj, bytearray):
                root = root.obj  # parse()'s views of a captured blob: the bytearray itself, as get_data made it
            try:
                plain = isinstance(root, np.ndarray) and root.dtype == np.uint8 and root.ndim == 1
                base = root if plain else np.frombuffer(root, np.uint8)
            except (TypeError, ValueError):
                return None
            if base.nbytes < size:
                return None
        if t.__array_interface__["data"][0] != base.__array_interface__["data"][0] + at:
            return None
    if base is None:
        return None
    view = memoryview(base)
    if any(view[at : at + len(head)] != head for at, head in heads):
        return None
    if isinstance(root, bytearray) and len(root) == size:
        return root
    return base if base.nbytes == size else base[:size]  # room after it: place()'s slack_bytes


def prefix(blob: bytearray, layout: BlobLayout, n_tokens: int, n: int) -> bytearray:
    """The state of the first `n` of an attention-only blob's `n_tokens` tokens: its first n cells, keys and
    values (what the same tokens alone leave in the cache: a token's K and V depend on those before it only)."""
    if layout.has_recurrent or not 0 < n <= n_tokens:
        raise StateFormatError(f"no prefix of {n} tokens in a state of {n_tokens} (attention-only states only).")
    cut = [
        AttentionState(keys=lay.keys[:, :n], values=lay.values[:, :n]) if isinstance(lay, AttentionState) else lay
        for lay in parse(blob, layout, n_tokens)
    ]
    return serialize(cut, layout, n)


def _none_if_empty(t: np.ndarray) -> np.ndarray | None:
    return None if t.size == 0 else t


def _ggml_id(a) -> int:
    name = arrays.dtype_name(a)
    if name not in _GGML_IDS:
        raise StateFormatError(f"a llama.cpp state holds f32/f16 arrays, not {name}.")
    return _GGML_IDS[name]


def _itemsize(a) -> int:
    """Bytes per element of a state array, by its ggml type (which _ggml_id checks is f32 or f16)."""
    return GGML_TYPES[_ggml_id(a)].itemsize


def _transposed(v):
    """(1, tokens, elements) values as llama.cpp stores them transposed: (elements, tokens), row-major."""
    return np.ascontiguousarray(arrays.as_kind(v, arrays.NUMPY)[0].T)


def _attention(layer: LayerState) -> AttentionState:
    att = layer.attention if isinstance(layer, HybridState) else layer
    if not isinstance(att, AttentionState):
        raise StateFormatError(f"expected an attention state, got a {layer.kind} layer.")
    return att


def _recurrent(layer: LayerState) -> RecurrentState:
    rec = layer.recurrent if isinstance(layer, HybridState) else layer
    if not isinstance(rec, RecurrentState):
        raise StateFormatError(f"expected a recurrent state, got a {layer.kind} layer.")
    return rec
