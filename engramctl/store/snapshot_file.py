"""One snapshot = one safetensors file, written atomically and checksummed.

This module knows tensors and string metadata, not models: the state layer maps a
SessionState onto the flat tensor dict and checks it against the model.

Layout of the file (plain safetensors, readable by any safetensors tool):
    8-byte little-endian header length | header JSON (with "__metadata__") | tensor bytes
The checksum covers the canonical header JSON without the checksum entry, then the tensor bytes, so
a flipped byte anywhere in the file is caught. It is XXH3-128: it detects damage, not tampering (files
are 0600 under the user's own data dir), and at ~28 GB/s against sha256's ~1.8 GB/s here it keeps
verification from dominating a disk restore. sha256 files are still verified.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path

from xxhash import xxh3_128

from engramctl.errors import SnapshotCorrupt, SnapshotMismatch
from engramctl.store import arrays
from engramctl.store.arrays import Array
from engramctl.store.crashpoints import crash_point

FORMAT = "engram-snapshot"
FORMAT_VERSION = "1"
_HEADER_LEN_BYTES = 8


def _canonical(header: dict) -> bytes:
    meta = dict(header.get("__metadata__", {}))
    meta.pop("checksum", None)
    return json.dumps({**header, "__metadata__": meta}, sort_keys=True, separators=(",", ":")).encode()


_HASHES = {"xxh3_128": xxh3_128, "sha256": hashlib.sha256}
WRITE_HASH = "xxh3_128"


def _checksum(header: dict, data: memoryview | bytes, algo: str = WRITE_HASH) -> str:
    h = _HASHES[algo](_canonical(header))
    h.update(data)
    return f"{algo}:{h.hexdigest()}"


def encode(tensors: dict[str, Array], metadata: dict[str, str]) -> bytes:
    """Serialize tensors (numpy arrays or torch tensors: the same file) + metadata into the bytes of a complete,
    checksummed snapshot file."""
    return b"".join(encode_parts(tensors, metadata))


def encode_parts(tensors: dict[str, Array], metadata: dict[str, str]) -> list[bytes | memoryview]:
    """encode() as the file's parts in order, which write_atomic writes one after the other: the length-prefixed
    header, then each tensor's bytes as a view of the tensor's own memory. Nothing is copied: safetensors'
    serialize built the file in fresh memory, a copy of every tensor byte and a page fault per 4 KiB of it: the
    writer thread's CPU per 9.3 MB SmolLM2 snapshot went from 20-23 ms to 9 ms (scripts/bench_snapshot_path.py),
    CPU a 2-core machine takes from its decode threads (and a preempted decode thread's partner spins at ggml's
    next barrier meanwhile).
    The layout is safetensors' own, so any safetensors tool reads the file: tensors with larger elements first
    (each starts aligned to its element size), then by name, back to back; the data section 8-byte aligned."""
    entries = []
    for name, t in tensors.items():
        # a view of the tensor's memory when it is contiguous on the CPU (states are)
        entries.append((name, _dtype_code(t), arrays.shape(t), arrays.host_bytes(t)))
    return encode_entries(entries, metadata)


def encode_entries(
    entries: Sequence[tuple[str, str, Sequence[int], memoryview]], metadata: dict[str, str]
) -> list[bytes | memoryview]:
    """encode_parts() of tensors given as (name, safetensors dtype code, shape, their bytes in row-major order):
    how a KV block (store/blocks.py), cut from the bytes of larger tensors, is written without building arrays."""
    meta = {**{k: str(v) for k, v in metadata.items()}, "format": FORMAT, "format_version": FORMAT_VERSION}
    header: dict = {}
    views: list[memoryview] = []
    at = 0
    for name, code, shape, view in sorted(entries, key=lambda e: (-_DTYPE_BYTES[e[1]], e[0])):
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [at, at + view.nbytes]}
        views.append(view)
        at += view.nbytes
    header["__metadata__"] = meta
    h = _HASHES[WRITE_HASH](_canonical(header))
    for view in views:  # the checksum of the data section, which is these views back to back
        h.update(view)
    meta["checksum"] = f"{WRITE_HASH}:{h.hexdigest()}"
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # safetensors aligns the data section to 8 bytes
    return [struct.pack("<Q", len(head)) + head, *views]


def _dtype_code(t: Array) -> str:
    name = arrays.dtype_name(t)
    code = arrays.SAFETENSORS_DTYPE.get(name)
    if code is None:
        raise ValueError(f"a tensor of dtype {name} has no safetensors form")
    return code


# safetensors' dtype names -> bytes per element (the ones safetensors.torch loads)
_DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2": 1,
    "F8_E5M2FNUZ": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}
_MAX_DIM = 2**31 - 1  # no state tensor has a longer dimension; a larger one is a damaged or hostile header
_MAX_RANK = 8
_SHOWN = 60  # characters of a hostile value quoted in an error message


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    # json.loads keeps the last of two equal keys: a second tensor (or metadata entry) under a name
    # already given would silently replace the first, so the file is refused instead.
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _HeaderError(f"names {_show(key)} twice")
        out[key] = value
    return out


class _HeaderError(ValueError):
    """What is wrong with a header, as the end of a sentence ("... has a bad header: <this>.")."""


class _Truncated(_HeaderError):
    """The header is well formed but the data section ends before the bytes it describes: a file cut short
    (or a header that lies about its sizes, which a checksum then also catches)."""


def _parse_header(raw: bytes | memoryview) -> dict:
    """The header JSON, checked to be what safetensors and this module expect: an object of tensor
    entries {dtype, shape, data_offsets} and a __metadata__ object of strings. Raises _HeaderError."""
    try:
        header = json.loads(bytes(raw), object_pairs_hook=_no_duplicates)
    except _HeaderError:
        raise
    except RecursionError:
        raise _HeaderError("its JSON nests deeper than any header does") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of 4,300+ digits
        raise _HeaderError(f"it is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise _HeaderError(f"it is not a JSON object but {_show(header)}")
    # safetensors makes __metadata__ optional: a file without one is some other program's (decode says so)
    meta = header.setdefault("__metadata__", {})
    if not isinstance(meta, dict):
        raise _HeaderError(f"__metadata__ is not an object of strings but {_show(meta)}")
    for key, value in meta.items():
        if not isinstance(value, str):
            raise _HeaderError(f"metadata {_show(key)} is not a string but {_show(value)}")
    for name, entry in header.items():
        if name != "__metadata__":
            _check_entry(name, entry)
    return header


def _check_entry(name: str, entry: object) -> None:
    # on every tensor of every block a restore reads (80 block files at 10K tokens): the sentence naming the tensor is
    # made only when something is wrong; `type(x) is int` refuses a bool (json's true is an int subclass)
    if not isinstance(entry, dict) or entry.keys() != _ENTRY_KEYS:
        raise _HeaderError(f"tensor {_show(name)} is not an entry of dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if type(dtype) is not str or dtype not in _DTYPE_BYTES:
        raise _HeaderError(f"tensor {_show(name)} has unknown dtype {_show(dtype)}")
    if type(shape) is not list or len(shape) > _MAX_RANK:
        raise _HeaderError(f"tensor {_show(name)} has shape {_show(shape)}, not a list of at most {_MAX_RANK} sizes")
    need = _DTYPE_BYTES[dtype]
    for d in shape:
        if type(d) is not int or not 0 <= d <= _MAX_DIM:
            raise _HeaderError(
                f"tensor {_show(name)} has shape {_show(shape)}: each size must be an integer in 0..{_MAX_DIM}"
            )
        need *= d  # Python integers: a shape that claims terabytes is a large number here, never an overflow
    if type(offsets) is not list or len(offsets) != 2 or type(offsets[0]) is not int or type(offsets[1]) is not int:
        raise _HeaderError(f"tensor {_show(name)} has data_offsets {_show(offsets)}, not two integers")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise _HeaderError(f"tensor {_show(name)} has data_offsets {_show(offsets)} that do not form a range")
    if need != end - begin:
        raise _HeaderError(
            f"tensor {_show(name)} is {dtype}{shape} ({need} bytes) but its data_offsets span {end - begin} bytes"
        )


_ENTRY_KEYS = {"dtype", "shape", "data_offsets"}


def _check_layout(header: dict, n_data: int) -> None:
    """The tensors' byte ranges must tile the data section exactly: no gap, no overlap, nothing past its end."""
    spans = sorted((e["data_offsets"][0], e["data_offsets"][1], k) for k, e in header.items() if k != "__metadata__")
    for _begin, end, name in spans:
        if end > n_data:  # said first: a size claimed past the end is the clearest description of such a file
            raise _Truncated(f"tensor {_show(name)} claims data up to byte {end}; the file holds {n_data} data bytes")
    at = 0
    for begin, end, name in spans:
        if begin != at:
            what = "overlaps the tensor before it" if begin < at else f"leaves {begin - at} bytes unaccounted before it"
            raise _HeaderError(f"tensor {_show(name)} starts at byte {begin}: it {what}")
        at = end
    if at != n_data:
        raise _HeaderError(f"its tensors need {at} data bytes and the file holds {n_data} (truncated or padded)")


def decode(buf: bytes, source: str = "snapshot") -> tuple[dict[str, Array], dict[str, str]]:
    """Verify and parse snapshot bytes. Raises SnapshotCorrupt / SnapshotMismatch with what is wrong.
    The tensors are of the kind its writer backend's states are (store/arrays.py `kind_of`): numpy arrays
    for a llama.cpp snapshot, torch tensors otherwise."""
    header = verify(buf, source)
    meta = header["__metadata__"]
    numpy = arrays.kind_of(meta) == arrays.NUMPY and all(
        e["dtype"] in arrays.NUMPY_SAFETENSORS_DTYPES for k, e in header.items() if k != "__metadata__"
    )
    if numpy:
        from safetensors.numpy import load as st_load
    else:
        from safetensors.torch import load as st_load

    try:
        tensors = st_load(bytes(buf))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise SnapshotCorrupt(f"{source} could not be parsed ({e}).") from None
    return tensors, dict(meta)


def verify(buf: bytes, source: str = "snapshot") -> dict:
    """The header of snapshot bytes whose checksum and format check out, without building its tensors.
    Raises SnapshotCorrupt / SnapshotMismatch with what is wrong.

    Every header field is checked before anything is allocated from it, so a damaged or hostile file
    costs at most a copy of its own size: sizes are compared with the bytes actually present."""
    n = header_length(
        bytes(buf[:_HEADER_LEN_BYTES]), len(buf), bytes(buf[_HEADER_LEN_BYTES : _HEADER_LEN_BYTES + 1]), source
    )
    data = memoryview(buf)[_HEADER_LEN_BYTES + n :]
    header = parse_header(memoryview(buf)[_HEADER_LEN_BYTES : _HEADER_LEN_BYTES + n], len(data), source)
    h = hasher(header)
    if h is not None:
        h.update(data)
    check_sum(header, h, source)
    return header


def header_length(first: bytes, file_nbytes: int, after: bytes, source: str) -> int:
    """The header's length from a file's first 8 bytes (`after`: the byte that follows them), checked against
    the file's size: SnapshotCorrupt when the file is too short for it."""
    if file_nbytes < _HEADER_LEN_BYTES or len(first) < _HEADER_LEN_BYTES:
        raise SnapshotCorrupt(f"{source} is truncated ({file_nbytes} bytes).")
    (n,) = struct.unpack("<Q", first[:_HEADER_LEN_BYTES])
    if n > file_nbytes - _HEADER_LEN_BYTES:
        if after[:1] != b"{":  # no safetensors header follows: not ours at all?
            raise SnapshotCorrupt(f"{source} is not a snapshot file (no safetensors header), or it is damaged.")
        raise SnapshotCorrupt(f"{source} is truncated: header says {n} bytes, file has {file_nbytes}.")
    return n


def parse_header(raw: bytes | memoryview, n_data: int, source: str) -> dict:
    """The header JSON of a file whose data section holds `n_data` bytes, every field checked and its tensors
    tiling the data section exactly; SnapshotCorrupt naming what is wrong."""
    try:
        header = _parse_header(raw)
        _check_layout(header, n_data)
    except _Truncated as e:
        raise SnapshotCorrupt(f"{source} is truncated: {e}.") from None
    except _HeaderError as e:
        raise SnapshotCorrupt(f"{source} has a bad header: {e}.") from None
    return header


def hasher(header: dict):
    """A hash object over the header, for the checksum its metadata names, to be fed the data section in order
    (None when the metadata names no algorithm this module knows: check_sum then decides)."""
    algo = header["__metadata__"].get("checksum", "").partition(":")[0]
    return _HASHES[algo](_canonical(header)) if algo in _HASHES else None


def check_sum(header: dict, h, source: str) -> None:
    """The checksum (`h`: hasher(header) fed the whole data section), then the format, checked: the checksum is
    verified before the format is believed, so a flipped bit in "format" or "format_version" is damage
    (quarantined), not a file of another kind (left alone). Raises SnapshotCorrupt / SnapshotMismatch."""
    meta = header["__metadata__"]
    ours = meta.get("format") == FORMAT
    algo = meta.get("checksum", "").partition(":")[0]
    if h is not None:
        if meta["checksum"] != f"{algo}:{h.hexdigest()}":
            raise SnapshotCorrupt(f"{source} failed its checksum: the file was modified or damaged.")
    elif ours and meta.get("format_version") == FORMAT_VERSION:
        raise SnapshotCorrupt(f"{source} has no valid checksum (checksum={_show(meta.get('checksum'))}).")
    if not ours:
        raise SnapshotMismatch(f"{source} is not an engramctl snapshot (format={_show(meta.get('format'))}).")
    if meta.get("format_version") != FORMAT_VERSION:
        raise SnapshotMismatch(
            f"{source} has snapshot format version {_show(meta.get('format_version'))}; "
            f"this engramctl reads version {FORMAT_VERSION}."
        )


def dtype_bytes(code: str) -> int:
    """Bytes per element of a safetensors dtype code (one parse_header accepted)."""
    return _DTYPE_BYTES[code]


def read_metadata(path: Path) -> dict[str, str]:
    """Header metadata only, without reading or verifying the payload (for listings)."""
    with open(path, "rb") as f:
        head = f.read(_HEADER_LEN_BYTES)
        if len(head) < _HEADER_LEN_BYTES:
            raise SnapshotCorrupt(f"{path.name} is truncated.")
        (n,) = struct.unpack("<Q", head)
        size = os.fstat(f.fileno()).st_size
        if n > size - _HEADER_LEN_BYTES:
            raise SnapshotCorrupt(f"{path.name} is truncated: header says {n} bytes, file has {size}.")
        try:
            return dict(_parse_header(f.read(n))["__metadata__"])
        except _HeaderError as e:
            raise SnapshotCorrupt(f"{path.name} has a bad header: {e}.") from None


def write_atomic(
    path: Path,
    buf: bytes | Sequence[bytes | memoryview],
    mode: int = 0o600,
    *,
    drop_cache: bool = True,
    sync_dir: bool = True,
) -> None:
    """temp file in the same directory, fsync, rename, fsync the directory: a reader sees all or nothing.
    `buf`: the file's bytes, or its parts in order (encode_parts), written one after the other.
    sync_dir=False leaves the directory's fsync to the caller, who writes several files and fsyncs it once
    before anything refers to them (the KV blocks of one snapshot).

    Once on disk, the file's pages leave the page cache (POSIX_FADV_DONTNEED): the memory tiers hold the hot
    copies, and a daemon writing two snapshots a turn would otherwise fill the cache with files it rarely
    reads, crowding out the model's memory-mapped weights, while each write took fresh pages. Measured
    (scripts/bench_snapshot_write.py): 25 MB written and fsynced cost the writer thread ~80-120 ms of CPU when
    its pages stayed cached, ~10 ms when they were dropped (the next write reuses them), CPU taken from the
    decode threads on a 2-core machine."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            for part in (buf,) if isinstance(buf, (bytes, bytearray, memoryview)) else buf:
                f.write(part)
            f.flush()
            crash_point("write.temp_written")
            os.fsync(f.fileno())
            if drop_cache and hasattr(os, "posix_fadvise"):  # Linux and most Unixes; elsewhere the cache keeps them
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        crash_point("write.fsynced")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    crash_point("write.replaced")
    if not sync_dir:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write(path: Path, tensors: dict[str, Array], metadata: dict[str, str]) -> int:
    """Write a snapshot file atomically; returns its size in bytes."""
    buf = encode(tensors, metadata)
    write_atomic(path, buf)
    return len(buf)


def read(path: Path) -> tuple[dict[str, Array], dict[str, str]]:
    path = Path(path)
    try:
        buf = path.read_bytes()
    except FileNotFoundError:
        raise SnapshotCorrupt(f"snapshot file {path.name} is missing.") from None
    return decode(buf, source=f"snapshot {path.name}")
