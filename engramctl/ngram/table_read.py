"""Reading an N-gram table's rows (spec §3; format: table_spec.py, checks: table_file.py).

A DiskTable gathers rows with os.preadv (one read per run of consecutive rows; the GIL is released during
each read, so reads overlap compute on other threads), or with O_DIRECT page reads (`read_mode="direct"`:
no page cache, every read goes to the device), or through a read-only numpy memmap (`read_mode="mmap"`).
It is never loaded whole. `DiskTable.load_resident()` reads it into RAM once, for a table the tier planner
placed in RAM: a ResidentTable gathers with numpy.take.
"""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

import numpy as np

from engramctl.errors import NgramTableCorrupt, NgramTableError, UsageError
from engramctl.ngram.table_file import check_table, generate_block
from engramctl.ngram.table_spec import GEN_BLOCK_ROWS, PAGE_BYTES, TableMeta, TableSpec, table_path

READ_MODES = ("pread", "direct", "mmap")


def open_table(
    directory: Path,
    layer_id: int,
    expect: TableSpec | None = None,
    read_mode: str = "pread",
    verify: bool = False,
) -> "DiskTable":
    """Open a written table for reading from disk after checking it (table_file.check_table)."""
    if read_mode not in READ_MODES:
        raise UsageError(f"read mode must be one of {', '.join(READ_MODES)}; got {read_mode!r}.")
    meta = check_table(directory, layer_id, expect, verify)
    return DiskTable(table_path(directory, layer_id), meta, read_mode)


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
