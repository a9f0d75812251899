"""Reading a stored snapshot back from disk in one pass: its own file and its KV blocks, each byte read once,
straight into the arrays the payload is made of, each file's checksum verified as its bytes arrive, the blocks
read in parallel.

Where the bytes land is the caller's to say (`into`, a Placer): given the snapshot's metadata and its tensors'
dtypes and full shapes, it returns, for the tensors it lays out, a writable, contiguous uint8 array of exactly
each tensor's bytes: views of one buffer laid out as the backend's own state blob (engine/llama_place.py), so
that a restore reads the disk into the blob the backend loads, no copy between. A tensor it does not place gets
an array of its own. Reading into the final place means no intermediate file buffer, no join of the blocks
into fresh arrays, no second serialization: a cold restore of SmolLM2 at 4,379 tokens (~100 MB) went from
~500 ms to about a cold read of its bytes (BENCHMARKS.md, "Store").

A block's slice of a token-axis tensor of shape (before, tokens, after) is, in the full tensor, `before` runs of
contiguous bytes (one when before = 1, as llama.cpp's states are): they are the iovecs of one preadv.

What is checked is what snapshot_file.verify and blocks.join check: the header, that its tensors tile the data
section, the checksum before the format, and for each block its kind, id, model and the shape of each tensor.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from engramctl.errors import InvalidName, SnapshotCorrupt, SnapshotMismatch
from engramctl.store import arrays, snapshot_file
from engramctl.store.blocks import BLOCK_KIND, KV_BLOCKS, BlockCorrupt, block_list
from engramctl.store.records import Payload
from engramctl.store.threads import Workers

Entries = dict[str, tuple[str, tuple[int, ...]]]  # tensor name -> (safetensors dtype code, full shape)
# (the snapshot's metadata, its tensors) -> {name: writable contiguous uint8 array of the tensor's bytes} for the
# tensors it lays out, or None to lay out none
Placer = Callable[[dict[str, str], Entries], "dict[str, Any] | None"]

READERS = 4  # block files read at once: a virtio or NVMe disk serves several requests faster than one
_FIRST_READ = 4096  # a header is read with the first page; a longer one takes a second read
_MAX_IOV = 512  # iovecs per preadv (Linux's IOV_MAX is 1024)
# bytes read per preadv, then hashed and checked while still in the cache (an L2 is 1-2 MiB); a cold read of a file in
# such chunks is as fast as one read of the whole file (measured: 64 MiB in 0.5, 2 and 8 MiB chunks within 10%)
_CHUNK_BYTES = 1 << 19
_CODE_NAME = {code: name for name, code in arrays.SAFETENSORS_DTYPE.items()}
_executor = Workers(READERS, "engram-read")


def read_payload(
    path: Path, block_path: Callable[[str], Path], *, into: Placer | None = None, check_values: bool = False
) -> Payload:
    """A stored snapshot's whole payload, verified, from its own file at `path` and its KV blocks
    (`block_path(id)`). Raises SnapshotCorrupt (BlockCorrupt naming a damaged, missing or foreign block) or
    SnapshotMismatch (a file of another format or version). check_values: its floats are also checked for NaN
    and Inf, each piece right after it is read and checksummed, while it is in the cache (what from_payload's
    check_values would do in a second pass over the whole state); a file holding one is SnapshotCorrupt."""
    path = Path(path)
    source = f"snapshot {path.name}"
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise SnapshotCorrupt(f"snapshot file {path.name} is missing.") from None
    try:
        header, data_at, size = _head(fd, source)
        meta = dict(header["__metadata__"])
        entries = {k: (e["dtype"], tuple(e["shape"])) for k, e in header.items() if k != "__metadata__"}
        try:
            plan = _plan(meta, entries, source)
            problem = None
        except SnapshotCorrupt as e:  # said once the checksum holds: damage is reported as damage first
            plan, problem = _Plan(0, [], {}, entries), e
        dest = _destinations(meta, plan.full, into if problem is None else None)
        jobs = [] if problem is not None else _submit_blocks(plan, dest, meta, block_path, source, check_values)
        own_error: BaseException | None = None
        try:
            h = snapshot_file.hasher(header)
            pieces = _own_pieces(header, plan, dest)
            bad = _read_into(fd, data_at, pieces, h, size - data_at, source, check_values)
            snapshot_file.check_sum(header, h, source)
            _refuse_values(bad, source)
        except BaseException as e:  # noqa: BLE001 - raised once the block reads have stopped writing
            own_error = e
        block_error = _wait(jobs)
    finally:
        os.close(fd)
    if own_error is not None:
        raise own_error
    if problem is not None:
        raise problem
    if block_error is not None:
        raise block_error
    out_meta = {k: v for k, v in meta.items() if k != KV_BLOCKS}
    return _arrays(dest, plan.full, arrays.kind_of(meta)), out_meta


class _Plan:
    """The full tensors (`full`), and the blocks to read: ids in token order, tokens each, token axis per tensor."""

    def __init__(self, block_tokens: int, ids: list[str], axes: dict[str, int], full: Entries):
        self.block_tokens, self.ids, self.axes, self.full = block_tokens, ids, axes, full

    @property
    def start(self) -> int:
        """The first token of the own file's tails."""
        return len(self.ids) * self.block_tokens


def _plan(meta: dict[str, str], entries: Entries, source: str) -> _Plan:
    block_tokens, ids = block_list(meta)
    if not ids:
        return _Plan(block_tokens, [], {}, entries)
    n = int(meta["n_tokens"]) if meta.get("n_tokens", "").isdigit() else -1
    start = len(ids) * block_tokens
    axes = _token_axes(meta, entries, n - start) if n >= start else {}
    if not axes:
        raise SnapshotCorrupt(f"{source} lists KV blocks but its token axes do not match its tensors.")
    full = dict(entries)
    for name, axis in axes.items():
        code, shape = entries[name]
        full[name] = (code, shape[:axis] + (n,) + shape[axis + 1 :])
    return _Plan(block_tokens, ids, axes, full)


def _token_axes(meta: dict[str, str], entries: Entries, n_tail: int) -> dict[str, int]:
    """blocks.token_axes on shapes alone: {tensor: axis} when every declared axis exists and is n_tail long."""
    import json

    try:
        axes = json.loads(meta.get("token_axes") or "{}")
    except ValueError:
        return {}
    if not isinstance(axes, dict):
        return {}
    for name, axis in axes.items():
        if name not in entries or not isinstance(axis, int) or isinstance(axis, bool):
            return {}
        shape = entries[name][1]
        if not 0 <= axis < len(shape) or shape[axis] != n_tail:
            return {}
    return dict(sorted(axes.items()))


def _destinations(meta: dict[str, str], full: Entries, into: Placer | None) -> dict[str, Any]:
    """{name: contiguous uint8 array of the full tensor's bytes}: the placer's, else one of its own."""
    import numpy as np

    placed = (into(meta, full) or {}) if into is not None else {}
    dest: dict[str, Any] = {}
    for name, (code, shape) in full.items():
        nbytes = snapshot_file.dtype_bytes(code) * _prod(shape)
        buf = placed.get(name)
        if buf is None or buf.dtype != np.uint8 or buf.nbytes != nbytes or not buf.flags.c_contiguous:
            buf = np.empty(nbytes, np.uint8)
        dest[name] = buf
    return dest


def _rows(buf: Any, code: str, shape: tuple[int, ...], axis: int) -> Any:
    """A full tensor's bytes as (before, tokens, after-bytes) rows."""
    return buf.reshape(_prod(shape[:axis]), shape[axis], _prod(shape[axis + 1 :]) * snapshot_file.dtype_bytes(code))


Piece = tuple[memoryview, str, str]  # where some of a file's data goes, its dtype code, its tensor


def _own_pieces(header: dict, plan: _Plan, dest: dict[str, Any]) -> list[Piece]:
    """Where the own file's data section goes, in file order: whole tensors, and the tails of the token-axis ones
    (their tokens from plan.start)."""
    pieces: list[Piece] = []
    order = sorted((e["data_offsets"][0], k) for k, e in header.items() if k != "__metadata__")
    for _, name in order:
        axis = plan.axes.get(name)
        code, shape = plan.full[name]
        if axis is None:
            pieces.append((memoryview(dest[name]), code, name))
            continue
        rows = _rows(dest[name], code, shape, axis)
        pieces += [(_flat(rows[p, plan.start :, :]), code, name) for p in range(rows.shape[0])]
    return pieces


def _submit_blocks(
    plan: _Plan,
    dest: dict[str, Any],
    meta: dict[str, str],
    block_path: Callable[[str], Path],
    source: str,
    check_values: bool,
) -> list[concurrent.futures.Future]:
    if not plan.ids:
        return []
    pool = _executor()
    fingerprint = meta.get("fingerprint", "")
    rows = {name: _rows(dest[name], *plan.full[name], axis) for name, axis in plan.axes.items()}
    want: dict[str, tuple[str, list[int]]] = {}
    for name, axis in plan.axes.items():
        code, shape = plan.full[name]
        block_shape = list(shape)
        block_shape[axis] = plan.block_tokens
        want[name] = (code, block_shape)
    return [
        pool.submit(_read_block, bid, i, plan.block_tokens, rows, want, fingerprint, block_path, source, check_values)
        for i, bid in enumerate(plan.ids)
    ]


def _read_block(
    bid: str,
    i: int,
    block_tokens: int,
    rows: dict[str, Any],
    want: dict[str, tuple[str, list[int]]],
    fingerprint: str,
    block_path: Callable[[str], Path],
    source: str,
    check_values: bool = False,
) -> None:
    """Read block `bid` (the i-th) into its tokens' rows of the full tensors, verified; BlockCorrupt otherwise."""
    what = f"KV block {bid} of {source}"
    try:
        fd = os.open(block_path(bid), os.O_RDONLY)
    except FileNotFoundError:
        raise BlockCorrupt(bid, f"KV block {bid} is missing.") from None
    except InvalidName:  # not a block id: a damaged list
        raise BlockCorrupt(bid, f"{bid[:40]!r} is not a KV block id.") from None
    try:
        header, data_at, size = _head(fd, what)
        names = {k for k in header if k != "__metadata__"}
        for name, (code, shape) in want.items():
            entry = header.get(name)
            if entry is None or entry["dtype"] != code or entry["shape"] != shape:
                raise BlockCorrupt(bid, f"{what} does not hold {name} as the snapshot needs it.")
        if names != set(want):
            raise BlockCorrupt(bid, f"{what} holds tensors the snapshot does not list.")
        lo, hi = i * block_tokens, (i + 1) * block_tokens
        pieces: list[Piece] = []
        for _, name in sorted((header[k]["data_offsets"][0], k) for k in names):
            r = rows[name]
            pieces += [(_flat(r[p, lo:hi, :]), want[name][0], name) for p in range(r.shape[0])]
        h = snapshot_file.hasher(header)
        bad = _read_into(fd, data_at, pieces, h, size - data_at, what, check_values)
        snapshot_file.check_sum(header, h, what)
        _refuse_values(bad, what)
    except (SnapshotCorrupt, SnapshotMismatch) as e:  # a mismatch: not a block this engramctl wrote
        if isinstance(e, BlockCorrupt):
            raise
        raise BlockCorrupt(bid, e.message) from None
    finally:
        os.close(fd)
    bmeta = header["__metadata__"]
    if bmeta.get("kind") != BLOCK_KIND or bmeta.get("block_id") != bid or bmeta.get("fingerprint") != fingerprint:
        raise BlockCorrupt(bid, f"{what} is another block or another model's.")


def _head(fd: int, source: str) -> tuple[dict, int, int]:
    """(header, where the data section starts, file size) of an open snapshot or block file, checked."""
    size = os.fstat(fd).st_size
    first = os.pread(fd, _FIRST_READ, 0)
    n = snapshot_file.header_length(first[:8], size, first[8:9], source)
    raw = first[8 : 8 + n]
    if len(raw) < n:
        raw += os.pread(fd, n - len(raw), len(first))
        if len(raw) < n:
            raise SnapshotCorrupt(f"{source} is truncated: header says {n} bytes, file has {size}.")
    return snapshot_file.parse_header(raw, size - 8 - n, source), 8 + n, size


def _read_into(
    fd: int, at: int, pieces: Sequence[Piece], h, n_data: int, source: str, check_values: bool = False
) -> str | None:
    """Fill `pieces` (the data section, in order) from the file at `at`, `_CHUNK_BYTES` at a time, each chunk hashed
    (h: snapshot_file.hasher's) and, with check_values, checked for NaN/Inf right after it is read, while it is still
    in the core's cache: one pass over memory instead of three (read, hash, check). Returns the first tensor holding
    a NaN or Inf (None: none does), for the caller to refuse once the checksum holds: damage is reported as damage."""
    total = sum(p.nbytes for p, _, _ in pieces)
    if total != n_data:  # parse_header checked the tensors tile the data section: this is the file's own size
        raise SnapshotCorrupt(f"{source} is truncated: its tensors need {total} data bytes, it holds {n_data}.")
    bad: str | None = None
    for batch in _chunks(pieces):
        views = [v for v, _, _ in batch]
        got = os.preadv(fd, views, at)
        want = sum(v.nbytes for v in views)
        if got < want:  # a short read (a signal, the 2 GiB per call limit): finish this batch piece by piece
            got = _finish(fd, views, at, got, source)
        at += got
        if h is not None:
            for v in views:
                h.update(v)
        if check_values and bad is None:
            bad = _non_finite(batch)
    return bad


def _chunks(pieces: Sequence[Piece]) -> Iterator[list[Piece]]:
    """`pieces` (empty ones left out) as consecutive batches of at most `_CHUNK_BYTES` and `_MAX_IOV` views, a piece
    longer than a chunk cut in slices of whole values (bytes_finite reads them by their width)."""
    batch: list[Piece] = []
    size = 0
    for view, code, name in pieces:
        item = snapshot_file.dtype_bytes(code)
        at = 0
        while at < view.nbytes:
            room = _CHUNK_BYTES - size
            n = min(view.nbytes - at, room - room % item)
            if n == 0:  # not one value's room left in this chunk
                yield batch
                batch, size = [], 0
                continue
            batch.append((view[at : at + n], code, name))
            at += n
            size += n
            if size == _CHUNK_BYTES or len(batch) == _MAX_IOV:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _finish(fd: int, batch: list[memoryview], at: int, done: int, source: str) -> int:
    offset = 0
    for p in batch:
        end = offset + p.nbytes
        while done < end:
            n = os.preadv(fd, [p[done - offset :]], at + done)
            if n == 0:
                raise SnapshotCorrupt(f"{source} is truncated: it ended while it was being read.")
            done += n
        offset = end
    return done


def _refuse_values(bad: str | None, source: str) -> None:
    if bad is not None:
        raise SnapshotCorrupt(f"{source} holds NaN or Inf values in {bad}; refusing it.")


def _non_finite(pieces: Sequence[Piece]) -> str | None:
    """The name of the first tensor among `pieces` holding a NaN or Inf, None when every value is finite."""
    for view, code, name in pieces:
        if not arrays.bytes_finite(view, code):
            return name
    return None


def _wait(jobs: list[concurrent.futures.Future]) -> BaseException | None:
    """Wait for every block read; the first one's error in token order (None when all were read)."""
    first = None
    for job in jobs:
        e = job.exception()
        if e is not None and first is None:
            first = e
    return first


def _arrays(dest: dict[str, Any], full: Entries, kind: str) -> dict[str, Any]:
    """The payload's arrays over the bytes read: numpy for a llama.cpp snapshot (when numpy has every dtype),
    torch otherwise (snapshot_file.decode's rule)."""
    import numpy as np

    numpy = kind == arrays.NUMPY and all(code in arrays.NUMPY_SAFETENSORS_DTYPES for code, _ in full.values())
    unknown = sorted({code for code, _ in full.values()} - set(_CODE_NAME))
    if unknown:
        raise SnapshotMismatch(f"the snapshot holds tensors of dtype {unknown[0]}, which this engramctl does not read.")
    out: dict[str, Any] = {}
    if numpy:
        for name, (code, shape) in full.items():
            out[name] = dest[name].view(np.dtype(_CODE_NAME[code])).reshape(shape)
        return out
    import torch

    for name, (code, shape) in full.items():
        out[name] = torch.from_numpy(dest[name]).view(getattr(torch, _CODE_NAME[code])).reshape(shape)
    return out


def _prod(dims: Sequence[int]) -> int:
    p = 1
    for d in dims:
        p *= int(d)
    return p


def _flat(rows: Any) -> memoryview:
    """A contiguous run of (tokens, bytes) rows as one flat byte view (a view, not a copy)."""
    return memoryview(rows.reshape(-1))
