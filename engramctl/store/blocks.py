"""A snapshot's attention KV as content-addressed blocks, shared by every snapshot that holds the same tokens.

A payload whose metadata names its token axes (`token_axes`, JSON {tensor name: axis}: state/codec.to_payload
writes it from the StateSpec, the dims a TensorSpec marks TOKENS) is stored in two parts:
- blocks: for each full run of BLOCK_TOKENS tokens, one file holding that run's slice of every token-axis
  tensor (blocks/<block id>.safetensors, checksummed like any snapshot file, its metadata naming the model
  fingerprint and its own id);
- the constant part, the snapshot's own file: every tensor without a token axis (recurrent state, logits,
  token ids), the token-axis tensors' last, partial block, and metadata `kv_blocks` listing the block ids.
A payload without token axes (pure recurrent state, an import of an old file) has no blocks.

A block's id chains, as nano-vllm's block manager does: id(i) = H(id(i-1), the block's token ids, its bytes),
seeded with the model fingerprint. Token ids alone would let two computations of the same tokens in different
prefill chunks (bitwise different KV) share a block, and a restore must give back the captured state bitwise;
so the block's bytes (xxh3-128, names, dtypes and shapes included) are part of its id, and two snapshots share
a block exactly when they share its tokens, everything before them, and its bytes.

Everything here works on the tensors' bytes (a token-axis tensor seen as (before, tokens, after-bytes) uint8
rows), so it is the same for numpy and torch and for every dtype; numpy is imported only when a block is cut
or joined.
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xxhash import xxh3_128

from engramctl.errors import SnapshotCorrupt
from engramctl.store import arrays, snapshot_file
from engramctl.store.arrays import Array

# Tokens per block. A snapshot's own file rewrites its last, partial block (on average half a block), so a turn
# of two snapshots writes about one block more than its new tokens' KV; 128 keeps that within the 1.25x of a
# ~1,000-token turn on SmolLM2 (256 measured up to 1.4x), at 2.8 MiB of f16 KV a block and 128 files for 16K tokens.
BLOCK_TOKENS = 128
TOKEN_AXES = "token_axes"  # payload metadata: which axis of which tensor runs over the tokens
KV_BLOCKS = "kv_blocks"  # the constant part's metadata: {"tokens": BLOCK_TOKENS, "ids": [block ids in order]}
BLOCK_KIND = "kv_block"  # a block file's metadata "kind"
_DOMAIN = b"engram-kv-block-v1\0"


class BlockCorrupt(SnapshotCorrupt):
    """A block file is missing or damaged: every snapshot that uses it is lost (and only those)."""

    def __init__(self, block_id: str, message: str):
        super().__init__(message, hint="the sessions that used it resume from their transcripts")
        self.block_id = block_id


@dataclass(frozen=True)
class Block:
    """One block of a payload: its id, and where its bytes are (cut only when it is written: a block already
    stored costs its hash, not a copy)."""

    id: str
    n_tokens: int
    start: int  # its first token
    rows: dict[str, Any]  # tensor name -> the whole tensor as (before, tokens, after-bytes) uint8 rows
    meta: tuple[tuple[str, str, tuple[int, ...]], ...]  # (name, dtype code, block shape) per tensor

    @property
    def data_nbytes(self) -> int:
        """Its tensors' bytes (the file adds a header of a few hundred bytes)."""
        return sum(self.rows[name].shape[0] * self.n_tokens * self.rows[name].shape[2] for name, _, _ in self.meta)

    def parts(self, fingerprint: str) -> list:
        """The block file's bytes, in parts (snapshot_file.encode_entries)."""
        import numpy as np

        entries = []
        for name, code, shape in self.meta:
            part = np.ascontiguousarray(self.rows[name][:, self.start : self.start + self.n_tokens, :])
            entries.append((name, code, shape, memoryview(part.reshape(-1))))
        meta = {"kind": BLOCK_KIND, "block_id": self.id, "fingerprint": fingerprint, "n_tokens": str(self.n_tokens)}
        return snapshot_file.encode_entries(entries, meta)


def token_axes(tensors: dict[str, Array], meta: dict[str, str], n_tokens: int) -> dict[str, int]:
    """{tensor: token axis} the payload declares, each checked against the tensor (the axis exists and is
    n_tokens long); {} when it declares none, or anything that does not check out (stored whole then)."""
    try:
        axes = json.loads(meta.get(TOKEN_AXES) or "{}")
    except ValueError:
        return {}
    if not isinstance(axes, dict):
        return {}
    for name, axis in axes.items():
        t = tensors.get(name)
        if t is None or not isinstance(axis, int) or isinstance(axis, bool):
            return {}
        shape = arrays.shape(t)
        if not 0 <= axis < len(shape) or shape[axis] != n_tokens:
            return {}
    return dict(sorted(axes.items()))


def split(
    tensors: dict[str, Array], meta: dict[str, str], ids: Sequence[int] | None, block_tokens: int = BLOCK_TOKENS
) -> tuple[dict[str, Array], dict[str, str], list[Block]]:
    """(the constant part's tensors, its metadata, the blocks) of a payload. No blocks (the payload as it is)
    when it has no token axes, no token ids or fewer than block_tokens tokens."""
    n = len(ids) if ids is not None else 0
    axes = token_axes(tensors, meta, n) if ids is not None else {}
    n_full = n // block_tokens
    if not axes or n_full == 0:
        return tensors, {k: v for k, v in meta.items() if k != KV_BLOCKS}, []
    rows = {name: _rows(tensors[name], axis) for name, axis in axes.items()}
    codes = {name: arrays.SAFETENSORS_DTYPE[arrays.dtype_name(tensors[name])] for name in axes}
    shapes = {}
    for name, axis in axes.items():
        shape = list(arrays.shape(tensors[name]))
        shape[axis] = block_tokens
        shapes[name] = tuple(shape)
    layout = tuple((name, codes[name], shapes[name]) for name in axes)
    prev = hashlib.sha256(_DOMAIN + meta.get("fingerprint", "").encode()).digest()
    blocks: list[Block] = []
    for i in range(n_full):
        lo, hi = i * block_tokens, (i + 1) * block_tokens
        content = xxh3_128()
        for name, code, shape in layout:
            content.update(f"{name}\0{code}\0{list(shape)}\0".encode())
            r = rows[name]
            for p in range(r.shape[0]):  # each row's run of tokens is contiguous: hashed where it lies, no copy
                content.update(memoryview(r[p, lo:hi, :]).cast("B") if r.shape[2] else b"")
        h = hashlib.sha256(prev)
        h.update(id_bytes(ids[lo:hi]))  # type: ignore[index]
        h.update(content.digest())
        prev = h.digest()
        blocks.append(Block(h.hexdigest()[:32], block_tokens, lo, rows, layout))
    constant = dict(tensors)
    start = n_full * block_tokens
    for name, axis in axes.items():
        constant[name] = tensors[name][(slice(None),) * axis + (slice(start, None),)]
    out_meta = {k: v for k, v in meta.items() if k != KV_BLOCKS}
    out_meta[KV_BLOCKS] = json.dumps({"tokens": block_tokens, "ids": [b.id for b in blocks]}, separators=(",", ":"))
    return constant, out_meta, blocks


def block_ids(meta: dict[str, str]) -> list[str]:
    """The ids of the blocks a constant part's metadata lists (none for a snapshot stored whole)."""
    return block_list(meta)[1]


def block_list(meta: dict[str, str]) -> tuple[int, list[str]]:
    """(tokens per block, block ids) from a constant part's metadata; SnapshotCorrupt when it is malformed."""
    raw = meta.get(KV_BLOCKS)
    if not raw:
        return BLOCK_TOKENS, []
    try:
        info = json.loads(raw)
    except (ValueError, RecursionError):
        info = None
    ids = info.get("ids") if isinstance(info, dict) else None
    tokens = info.get("tokens") if isinstance(info, dict) else None
    if not (isinstance(ids, list) and all(isinstance(i, str) for i in ids) and type(tokens) is int and tokens > 0):
        raise SnapshotCorrupt("snapshot metadata kv_blocks is not a block size and a list of block ids.")
    return tokens, ids


def _prod(dims: Sequence[int]) -> int:
    p = 1
    for d in dims:
        p *= int(d)
    return p


def _rows(t: Array, axis: int):
    """`t`'s bytes as a (dims before the axis, tokens, bytes after it) uint8 array (a view when t is a
    contiguous CPU array)."""
    import numpy as np

    shape = arrays.shape(t)
    pre, n, post = _prod(shape[:axis]), shape[axis], _prod(shape[axis + 1 :]) * _itemsize(t)
    flat = np.frombuffer(arrays.host_bytes(t), np.uint8) if arrays.nbytes(t) else np.empty(0, np.uint8)
    return flat.reshape(pre, n, post)


def _itemsize(t: Array) -> int:
    return t.itemsize if arrays.is_numpy(t) else t.element_size()


def id_bytes(ids: Sequence[int]) -> bytes:
    a = array("q", ids)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()
