"""The floor restores are measured against, taken in the same run on the same machine:

- memcpy: torch `copy_` of a large uint8 buffer into a preallocated one (bytes copied per second);
  a RAM-tier restore moves the snapshot's bytes at best this fast.
- sequential read, cold: a file of that size written with fsync in the bench's data dir, evicted
  from the page cache (posix_fadvise DONTNEED, checked with mincore), read in 8 MiB chunks; a disk
  restore reads the snapshot file at best this fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from engramctl.bench import coldio
from engramctl.bench.timing import Series, timed


def memcpy_bandwidth(nbytes: int, runs: int) -> dict[str, Any]:
    import torch

    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: page in dst
    series = Series()
    for _ in range(runs):
        series.add(timed(lambda: dst.copy_(src))[1])
    med = series.median_ms() / 1000
    return {"bytes": nbytes, "bytes_per_s": nbytes / med, "time": series.summary()}


def one_memcpy_ms(nbytes: int, runs: int) -> float:
    """Median ms of ONE single-threaded memcpy of `nbytes` between two touched buffers: what a copy of a
    state of that size costs here through an API that copies it once (llama_state_seq_set_data does).
    Not the same as nbytes / memcpy bandwidth: glibc switches to non-temporal stores above a size tied to
    the L3 cache, so a 256 MiB copy runs faster per byte than a state-sized one (measured here: 9.4 GB/s
    at 256 MiB, 6.5 GB/s at 31 MiB; torch's copy_ above uses 2 threads)."""
    import ctypes

    import torch

    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)
    ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)  # warm-up: both paged in
    series = Series()
    for _ in range(max(runs, 5)):
        series.add(timed(lambda: ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes))[1])
    return series.median_ms()


def disk_read_bandwidth(directory: Path, nbytes: int, runs: int) -> dict[str, Any]:
    path = Path(directory) / "bandwidth-probe.bin"
    block = os.urandom(1 << 20)  # incompressible, in case the storage compresses
    with open(path, "wb") as f:
        for _ in range(max(1, nbytes // len(block))):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    size = path.stat().st_size
    series, cached = Series(), []
    try:
        for _ in range(runs):
            evicted = coldio.evict(path)
            cached.append(coldio.cached_fraction(path))
            series.add(timed(lambda: coldio.read_file(path))[1])
        warm = Series()
        for _ in range(runs):
            warm.add(timed(lambda: coldio.read_file(path))[1])
    finally:
        path.unlink(missing_ok=True)
    med = series.median_ms() / 1000
    known = [c for c in cached if c is not None]
    return {
        "bytes": size,
        "bytes_per_s": size / med,
        "time": series.summary(),
        "evicted": evicted,
        "cached_fraction_before_read": max(known) if known else None,
        "warm_bytes_per_s": size / (warm.median_ms() / 1000),
    }


def measure(
    directory: Path, memcpy_bytes: int, disk_bytes: int, runs: int, step: Callable[[], None] = lambda: None
) -> dict[str, Any]:
    mem = memcpy_bandwidth(memcpy_bytes, runs)
    step()
    disk = disk_read_bandwidth(directory, disk_bytes, runs)
    step()
    return {
        "memcpy_bytes_per_s": round(mem["bytes_per_s"]),
        "disk_read_bytes_per_s": round(disk["bytes_per_s"]),
        "disk_read_warm_bytes_per_s": round(disk["warm_bytes_per_s"]),
        "memcpy": {"bytes": mem["bytes"], **mem["time"]},
        "disk_read": {
            "bytes": disk["bytes"],
            "evicted": disk["evicted"],
            "cached_fraction_before_read": disk["cached_fraction_before_read"],
            **disk["time"],
        },
        "directory": str(directory),
    }
