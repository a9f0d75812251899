"""The N-gram embedding tables on disk and in RAM (spec §3).

One flat row-major file per Engram layer: `layer-<id>.table` holds rows x row_bytes bytes, row r at byte
r * row_bytes (rows in (order, head, index) order, so a global row id = offsets[col] + head-local index,
spec §2.5). Next to it `layer-<id>.table.json` (JSON, never pickle) records the format, layer, shape,
dtype, seed, init, the config hash of the Engram config it belongs to, an XXH3-128 checksum of every
byte, and a probe checksum of a few sampled pages. The sidecar is written last: a table without one is
incomplete and refused.

Writing (`write_table`): generated in blocks of GEN_BLOCK_ROWS rows, block b from numpy's PCG64 seeded
with (seed, layer id, b), so the bytes do not depend on how many threads generated them; written to a
temp file, fsynced, renamed, directory fsynced. Every page is really written (spec §3: untouched pages
map to the zero page and make gathers look fast). Inits: "normal" is N(0, 1), what nn.Embedding gives
the demo's tables; "bits" is seeded random bits with the exponent's top bit cleared (finite, |x| < 2),
several times faster to generate, for benchmark tables of many GiB.

Opening (`open_table`) checks the sidecar against the expected spec (another layer, shape, dtype, seed
or config hash -> NgramTableMismatch), the file size (truncated -> NgramTableCorrupt) and the probe
pages (-> NgramTableCorrupt); `verify=True` also streams the whole file through the checksum.

Reading: a DiskTable gathers rows with os.preadv (one read per run of consecutive rows; the GIL is
released during each read, so reads overlap compute on other threads), or with O_DIRECT page reads
(`read_mode="direct"`: no page cache, every read goes to the device), or through a read-only numpy
memmap (`read_mode="mmap"`). It is never loaded whole. `DiskTable.load_resident()` reads it into RAM
once, for a table the tier planner placed in RAM: a ResidentTable gathers with numpy.take.
"""

from __future__ import annotations

import json
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from engramctl.errors import NgramTableCorrupt, NgramTableError, NgramTableMismatch, UsageError

FORMAT = "engramctl-ngram-table/1"
GEN_BLOCK_ROWS = 65536  # part of the format: block b of the init is seeded (seed, layer, b)
PAGE_BYTES = 4096
PROBE_PAGES = 16  # pages checked at every open: first, last and evenly spaced ones between
READ_MODES = ("pread", "direct", "mmap")
INITS = ("normal", "bits")
# storage dtype, element bytes, the mask that keeps random bits finite and below 2 in magnitude
DTYPES: dict[str, tuple[type, int, int]] = {
    "float32": (np.float32, 4, 0xBFFFFFFF),
    "float16": (np.float16, 2, 0xBFFF),
    "bfloat16": (np.uint16, 2, 0xBFFF),  # numpy has no bfloat16: raw bits, viewed as torch.bfloat16
}
_BITS = {4: np.uint32, 2: np.uint16}


@dataclass(frozen=True)
class TableSpec:
    """What one layer's table is: the sidecar records all of it and opening checks all of it."""

    layer_id: int
    rows: int
    dim: int  # D_h: values per row
    dtype: str = "float16"
    seed: int = 0
    init: str = "normal"
    config_hash: str = ""  # the Engram config (and compressed vocabulary) the row ids come from

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UsageError(f"table dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}.")
        if self.init not in INITS:
            raise UsageError(f"table init must be one of {', '.join(INITS)}; got {self.init!r}.")
        if self.rows < 1 or self.dim < 1 or self.layer_id < 0:
            raise UsageError(f"a table needs rows >= 1, dim >= 1 and a layer id >= 0; got {self}.")

    @property
    def storage_dtype(self) -> np.dtype:
        return np.dtype(DTYPES[self.dtype][0])

    @property
    def row_bytes(self) -> int:
        return self.dim * DTYPES[self.dtype][1]

    @property
    def size_bytes(self) -> int:
        return self.rows * self.row_bytes

    def to_json(self) -> dict:
        return asdict(self)


def config_hash(*parts: object) -> str:
    """A short stable hash of whatever defines the row ids (the NgramConfig, V', the pad id)."""
    import hashlib

    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def table_path(directory: Path, layer_id: int) -> Path:
    return Path(directory) / f"layer-{layer_id}.table"


def meta_path(directory: Path, layer_id: int) -> Path:
    return Path(directory) / f"layer-{layer_id}.table.json"


# -- generation ----------------------------------------------------------------------------------------
def generate_block(spec: TableSpec, block: int) -> np.ndarray:
    """Rows [block * GEN_BLOCK_ROWS, ...) of the table's init, (n, dim) in the storage dtype."""
    start = block * GEN_BLOCK_ROWS
    n = min(GEN_BLOCK_ROWS, spec.rows - start)
    rng = np.random.default_rng([spec.seed, spec.layer_id, block])
    _, size, mask = DTYPES[spec.dtype]
    if spec.init == "bits":
        bits = _BITS[size]
        out = rng.integers(0, np.iinfo(bits).max, size=(n, spec.dim), dtype=bits, endpoint=True)
        np.bitwise_and(out, bits(mask), out=out)
        return out.view(spec.storage_dtype)
    values = rng.standard_normal((n, spec.dim), dtype=np.float32)
    if spec.dtype == "bfloat16":  # round to nearest even on the upper 16 bits, as torch's cast does
        u = values.view(np.uint32)
        return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    return values.astype(spec.storage_dtype)


def _blocks(spec: TableSpec, threads: int) -> Iterator[np.ndarray]:
    """The init's blocks in order, generated `threads` ahead (numpy's generators release the GIL)."""
    count = -(-spec.rows // GEN_BLOCK_ROWS)
    if threads <= 1:
        for b in range(count):
            yield generate_block(spec, b)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="ngram-init") as pool:
        pending = []
        for b in range(count):
            pending.append(pool.submit(generate_block, spec, b))
            if len(pending) > threads:
                yield pending.pop(0).result()
        for f in pending:
            yield f.result()


def _hasher():
    import xxhash

    return xxhash.xxh3_128()


def _probe_offsets(size_bytes: int) -> list[tuple[int, int]]:
    pages = -(-size_bytes // PAGE_BYTES)
    picks = sorted({int(i) for i in np.linspace(0, pages - 1, min(PROBE_PAGES, pages))})
    return [(p * PAGE_BYTES, min(PAGE_BYTES, size_bytes - p * PAGE_BYTES)) for p in picks]


def _probe_checksum(fd: int, size_bytes: int) -> str:
    h = _hasher()
    for offset, n in _probe_offsets(size_bytes):
        h.update(os.pread(fd, n, offset))
    return h.hexdigest()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_table(
    directory: Path,
    spec: TableSpec,
    threads: int | None = None,
    on_block: Callable[[int, int], None] | None = None,
) -> "TableMeta":
    """Write the layer's table once, atomically, every page touched; returns its sidecar.
    `on_block(done_bytes, total_bytes)` reports progress."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final, side = table_path(directory, spec.layer_id), meta_path(directory, spec.layer_id)
    side.unlink(missing_ok=True)  # from here until the new sidecar lands, the table is incomplete
    tmp = final.with_name(final.name + ".tmp")
    checksum = _hasher()
    done = 0
    try:
        with open(tmp, "wb", buffering=0) as f:
            for block in _blocks(spec, threads or min(4, os.cpu_count() or 1)):
                data = memoryview(block.reshape(-1).view(np.uint8))
                checksum.update(data)
                f.write(data)
                done += len(data)
                if on_block is not None:
                    on_block(done, spec.size_bytes)
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(final, os.O_RDONLY)
    try:
        probe = _probe_checksum(fd, spec.size_bytes)
    finally:
        os.close(fd)
    meta = TableMeta(spec=spec, checksum=checksum.hexdigest(), probe_checksum=probe)
    tmp_side = side.with_name(side.name + ".tmp")
    with open(tmp_side, "w", encoding="utf-8") as f:
        json.dump(meta.to_json(), f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_side, side)
    _fsync_dir(directory)
    return meta


@dataclass(frozen=True)
class TableMeta:
    spec: TableSpec
    checksum: str  # XXH3-128 of every byte of the table file
    probe_checksum: str  # XXH3-128 of the PROBE_PAGES sampled pages, checked at every open

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            **self.spec.to_json(),
            "row_bytes": self.spec.row_bytes,
            "size_bytes": self.spec.size_bytes,
            "checksum": self.checksum,
            "probe_checksum": self.probe_checksum,
        }

    @classmethod
    def read(cls, directory: Path, layer_id: int) -> "TableMeta":
        side = meta_path(directory, layer_id)
        try:
            raw = json.loads(side.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise NgramTableError(
                f"the N-gram table of layer {layer_id} in {directory} is missing or incomplete (no {side.name}).",
                hint="write it again (the engine does this on first load)",
            ) from None
        except (OSError, ValueError) as e:
            raise NgramTableCorrupt(f"{side} is not a readable table sidecar: {e}.") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise NgramTableMismatch(
                f"{side} is not an {FORMAT} sidecar (format {raw.get('format') if isinstance(raw, dict) else '?'})."
            )
        try:
            spec = TableSpec(**{k: raw[k] for k in TableSpec.__dataclass_fields__})
            return cls(spec=spec, checksum=str(raw["checksum"]), probe_checksum=str(raw["probe_checksum"]))
        except (KeyError, TypeError, UsageError) as e:
            raise NgramTableCorrupt(f"{side} lacks or garbles a field: {e}.") from None


def _check_expected(meta: TableMeta, expect: TableSpec | None, where: Path) -> None:
    if expect is None:
        return
    got, want = meta.spec.to_json(), expect.to_json()
    diffs = [f"{k} {got[k]!r} (expected {want[k]!r})" for k in want if got[k] != want[k]]
    if diffs:
        raise NgramTableMismatch(
            f"the N-gram table {where.name} in {where.parent} was written for another configuration: "
            + ", ".join(diffs)
            + ".",
            hint="delete it to have it written again for this configuration",
        )


def open_table(
    directory: Path,
    layer_id: int,
    expect: TableSpec | None = None,
    read_mode: str = "pread",
    verify: bool = False,
) -> "DiskTable":
    """Open a written table for reading from disk after checking it (see the module doc)."""
    if read_mode not in READ_MODES:
        raise UsageError(f"read mode must be one of {', '.join(READ_MODES)}; got {read_mode!r}.")
    meta = TableMeta.read(directory, layer_id)
    path = table_path(directory, layer_id)
    _check_expected(meta, expect, path)
    spec = meta.spec
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise NgramTableError(f"the N-gram table {path} is missing (its sidecar is there).") from None
    if size != spec.size_bytes:
        raise NgramTableCorrupt(
            f"the N-gram table {path} holds {size:,} bytes but {spec.rows:,} rows of {spec.row_bytes} bytes "
            f"need {spec.size_bytes:,}: it is truncated or was overwritten."
        )
    fd = os.open(path, os.O_RDONLY)
    try:
        if _probe_checksum(fd, size) != meta.probe_checksum:
            raise NgramTableCorrupt(f"the N-gram table {path} fails its probe checksum: its bytes were changed.")
        if verify:
            h = _hasher()
            buf = bytearray(8 << 20)
            offset = 0
            while offset < size:
                n = os.preadv(fd, [memoryview(buf)[: min(len(buf), size - offset)]], offset)
                if n <= 0:
                    break
                h.update(memoryview(buf)[:n])
                offset += n
            if h.hexdigest() != meta.checksum:
                raise NgramTableCorrupt(f"the N-gram table {path} fails its checksum: its bytes were changed.")
    finally:
        os.close(fd)
    return DiskTable(path, meta, read_mode)


# -- reading -------------------------------------------------------------------------------------------
def _runs(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start index, length) of each run of consecutive row ids in sorted `ids`."""
    if ids.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [ids.size]])
    return starts, ends - starts


def _check_ids(ids: np.ndarray, rows: int) -> None:
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        raise UsageError(f"row ids must lie in [0, {rows:,}); got {int(ids.min())}..{int(ids.max())}.")


class ResidentTable:
    """A table in RAM: a (rows, dim) numpy array in the storage dtype."""

    resident = True

    def __init__(self, spec: TableSpec, array: np.ndarray):
        if array.shape != (spec.rows, spec.dim) or array.dtype != spec.storage_dtype:
            raise UsageError(f"a resident table must be ({spec.rows}, {spec.dim}) {spec.storage_dtype}.")
        self.spec, self.array = spec, array

    @classmethod
    def generate(cls, spec: TableSpec) -> "ResidentTable":
        """The same bytes write_table would write, built in RAM (small tables, tests)."""
        array = np.empty((spec.rows, spec.dim), dtype=spec.storage_dtype)
        for b in range(-(-spec.rows // GEN_BLOCK_ROWS)):
            block = generate_block(spec, b)
            array[b * GEN_BLOCK_ROWS : b * GEN_BLOCK_ROWS + len(block)] = block
        return cls(spec, array)

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        """out[i] = T[ids[i]]."""
        _check_ids(ids, self.spec.rows)
        np.take(self.array, ids, axis=0, out=out)

    def close(self) -> None:
        pass


class DiskTable:
    """A table read from its file: rows are read on demand, the file is never loaded whole."""

    resident = False

    def __init__(self, path: Path, meta: TableMeta, read_mode: str = "pread"):
        self.path, self.meta, self.spec, self.read_mode = Path(path), meta, meta.spec, read_mode
        self._lock = threading.Lock()
        self._memmap: np.memmap | None = None
        flags = os.O_RDONLY
        if read_mode == "direct":
            if not hasattr(os, "O_DIRECT"):
                raise UsageError("O_DIRECT reads are not available on this platform; use read mode pread.")
            flags |= os.O_DIRECT
        try:
            self._fd: int | None = os.open(self.path, flags)
        except OSError as e:  # tmpfs and some filesystems refuse O_DIRECT
            raise UsageError(f"cannot open {self.path} with read mode {read_mode}: {e.strerror}.") from None
        if read_mode == "mmap":
            self._memmap = np.memmap(self.path, dtype=self.spec.storage_dtype, mode="r")
            self._memmap = self._memmap.reshape(self.spec.rows, self.spec.dim)

    def __enter__(self) -> "DiskTable":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._memmap = None

    def _fd_open(self) -> int:
        fd = self._fd
        if fd is None:
            raise NgramTableError(f"the N-gram table {self.path} was closed.")
        return fd

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        """out[i] = T[ids[i]] for sorted unique `ids` (any order works, sorted reads are faster).
        Safe to call from several threads at once on disjoint `out` slices."""
        ids = np.asarray(ids, dtype=np.int64)
        _check_ids(ids, self.spec.rows)
        if self.read_mode == "mmap":
            np.take(self._memmap, ids, axis=0, out=out)
            return
        if not out.flags.c_contiguous or out.shape[0] != len(ids) or out.dtype != self.spec.storage_dtype:
            raise UsageError(f"gather needs a C-contiguous ({len(ids)}, {self.spec.dim}) {self.spec.dtype} buffer.")
        fd, rb = self._fd_open(), self.spec.row_bytes
        flat = out.reshape(len(ids), -1).view(np.uint8)
        if self.read_mode == "direct":
            self._gather_direct(fd, ids, flat)
            return
        starts, lengths = _runs(ids)
        for s, n in zip(starts.tolist(), lengths.tolist()):
            got = os.preadv(fd, [flat[s : s + n]], int(ids[s]) * rb)
            if got != n * rb:
                raise NgramTableCorrupt(f"the N-gram table {self.path} ended early (short read at row {ids[s]}).")

    def _gather_direct(self, fd: int, ids: np.ndarray, flat: np.ndarray) -> None:
        """O_DIRECT wants page-aligned offsets, lengths and buffers: read the page span of each row into
        an anonymous (page-aligned) buffer and copy the row out of it."""
        rb = self.spec.row_bytes
        span_max = (-(-rb // PAGE_BYTES) + 1) * PAGE_BYTES
        bounce = mmap.mmap(-1, span_max)
        try:
            view = np.frombuffer(bounce, dtype=np.uint8)
            for i, row in enumerate(ids.tolist()):
                offset = row * rb
                start = offset - offset % PAGE_BYTES
                span = -(-(offset + rb - start) // PAGE_BYTES) * PAGE_BYTES
                got = os.preadv(fd, [memoryview(bounce)[:span]], start)
                if got < offset - start + rb:
                    raise NgramTableCorrupt(f"the N-gram table {self.path} ended early (short read at row {row}).")
                flat[i] = view[offset - start : offset - start + rb]
            del view
        finally:
            bounce.close()

    def load_resident(self) -> ResidentTable:
        """Read the whole table into RAM (for a table the planner placed in the RAM tier)."""
        array = np.empty((self.spec.rows, self.spec.dim), dtype=self.spec.storage_dtype)
        flat = array.reshape(-1).view(np.uint8)
        chunk = 64 << 20
        with open(self.path, "rb", buffering=0) as f:
            offset = 0
            while offset < len(flat):
                n = f.readinto(flat[offset : offset + chunk])
                if not n:
                    raise NgramTableCorrupt(f"the N-gram table {self.path} ended early while loading it into RAM.")
                offset += n
        return ResidentTable(self.spec, array)

    def evict_page_cache(self) -> bool:
        """Drop the file's pages from the page cache (posix_fadvise DONTNEED; no root needed), so the next
        reads go to the device. False where the platform cannot."""
        if not hasattr(os, "posix_fadvise"):
            return False
        os.posix_fadvise(self._fd_open(), 0, 0, os.POSIX_FADV_DONTNEED)
        return True


def tables_dir(data_dir: Path, name: str) -> Path:
    """Where one Engram config's tables live: <data dir>/ngram/<name>/ (name: its config hash, say)."""
    return Path(data_dir) / "ngram" / name


def installed_tables(directory: Path, recursive: bool = False) -> list[tuple[Path, TableMeta]]:
    """(table file, sidecar) of the complete tables in `directory` (with `recursive`, in its
    subdirectories too: the data dir's ngram/); an incomplete or foreign one is skipped."""
    out = []
    pattern = "**/layer-*.table.json" if recursive else "layer-*.table.json"
    for side in sorted(Path(directory).glob(pattern)):
        try:
            layer = int(side.name[len("layer-") : -len(".table.json")])
            out.append((table_path(side.parent, layer), TableMeta.read(side.parent, layer)))
        except (ValueError, NgramTableError):
            continue
    return out
