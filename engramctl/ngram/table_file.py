"""Writing an N-gram table file once, and checking one before it is read (spec §3; format: table_spec.py).

Writing (`write_table`): generated in blocks of GEN_BLOCK_ROWS rows, block b from numpy's PCG64 seeded
with (seed, layer id, b), so the bytes do not depend on how many threads generated them; written to a
temp file, fsynced, renamed, directory fsynced. Every page is really written (spec §3: untouched pages
map to the zero page and make gathers look fast). Inits: "normal" is N(0, 1), what nn.Embedding gives
the demo's tables; "bits" is seeded random bits with the exponent's top bit cleared (finite, |x| < 2),
several times faster to generate, for benchmark tables of many GiB.

Checking (`check_table`, used by table_read.open_table): the sidecar against the expected spec (another
layer, shape, dtype, seed or config hash -> NgramTableMismatch), the file size (truncated ->
NgramTableCorrupt) and the probe pages (-> NgramTableCorrupt); `verify=True` also streams the whole file
through the checksum.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from engramctl.errors import NgramTableCorrupt, NgramTableError, NgramTableMismatch
from engramctl.ngram.table_spec import (
    DTYPES,
    GEN_BLOCK_ROWS,
    PAGE_BYTES,
    PROBE_PAGES,
    TableMeta,
    TableSpec,
    meta_path,
    table_path,
)

_BITS = {4: np.uint32, 2: np.uint16}


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


def check_table(directory: Path, layer_id: int, expect: TableSpec | None = None, verify: bool = False) -> TableMeta:
    """The sidecar of a written table, after checking it (see the module doc)."""
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
    return meta
