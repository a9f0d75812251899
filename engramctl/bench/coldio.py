"""Cold reads: drop a file from the page cache, and check how much of it is still cached.

`evict(path)` fsyncs and calls posix_fadvise(POSIX_FADV_DONTNEED), which drops the file's clean
pages (every page, after the fsync). `cached_fraction(path)` asks the kernel with mincore(2) which
pages are resident, so a report can say whether a "cold" read really was cold. Both degrade to
"unknown" (False / None) where the platform lacks them; a VM's host may still cache the disk below us.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path


def evict(path: Path) -> bool:
    """Drop `path` from the page cache. False when the platform cannot (no posix_fadvise)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


_libc = None


def _mincore():
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        _libc = ctypes.CDLL(name, use_errno=True) if name else False
    if not _libc or not hasattr(_libc, "mincore"):
        return None
    fn = _libc.mincore
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    fn.restype = ctypes.c_int
    return fn


def cached_fraction(path: Path) -> float | None:
    """Fraction of `path`'s pages in the page cache (mincore), or None when it cannot be asked."""
    size = Path(path).stat().st_size
    if size == 0:
        return 0.0
    fn = _mincore()
    if fn is None:
        return None
    with open(path, "rb") as f:
        # A private copy-on-write mapping is writable for ctypes but touching nothing faults nothing in.
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        buf = ctypes.c_char.from_buffer(mm)
        try:
            page = mmap.PAGESIZE
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if fn(ctypes.addressof(buf), size, vec) != 0:
                return None
            return sum(v & 1 for v in vec) / pages
        finally:
            del buf
    finally:
        mm.close()


def read_file(path: Path, chunk: int = 8 << 20) -> int:
    """Read the whole file sequentially into one reused buffer; returns bytes read."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(view)
            if not n:
                break
            total += n
    return total
