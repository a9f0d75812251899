"""Prefetching the rows of a step while the blocks before the N-gram layer compute (spec §4.3, Path A).

    lookbacks = RowIds(hasher)                 # one per batch: the last N-1 compressed ids of each sequence
    ids = lookbacks.step(new_ids)              # {layer: (batch, T, (N-1)*K) global row ids}, before the backbone
    pending = prefetcher.submit(ids[layer])    # gather threads start reading now
    ... embedding, blocks < layer ...          # (torch releases the GIL: the reads overlap this)
    rows = pending.wait()                      # (batch, T, (N-1)*K, D_h); waits only for rows not there yet

Row ids depend only on token ids, so they are known before the backbone runs. A step's ids are deduplicated
(np.unique); the unique rows are split into chunks that the gather threads claim one at a time, and
`wait()` claims the chunks nobody has started yet and reads them on the calling thread, so the N-gram layer
waits only for reads already in flight. `fetch()` is the synchronous path (every read at the layer): the
same gather, started when the layer needs it. Staging is double-buffered: step s gathers into slot s % 2,
so step s+1's reads can run while step s's rows are still being consumed.

An optional RowCache keeps recently read rows of a disk table in RAM (least recently used, by rows).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from engramctl.errors import UsageError
from engramctl.ngram.hashing import NgramHasher

CHUNK_ROWS = 512  # rows one gather task reads: small enough for wait() to help, large enough to amortise


class RowSource(Protocol):
    """A table: engramctl.ngram.table_read.ResidentTable or DiskTable."""

    resident: bool

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None: ...


class RowIds:
    """Row ids of each step from token ids, with the last N-1 compressed ids of each sequence as lookback.

    `lookback` is what a conversation's snapshot must keep to resume (to_list / from_list)."""

    def __init__(self, hasher: NgramHasher, batch: int = 1, lookback=None):
        self.hasher = hasher
        self.width = hasher.config.max_ngram_size - 1
        self.lookback: list[list[int]] = [list(r) for r in lookback] if lookback is not None else [[]] * batch
        self._offsets = {layer: hasher.offsets(layer) for layer in hasher.config.layer_ids}

    def peek(self, new_ids) -> dict[int, np.ndarray]:
        """{layer: int64 (batch, T, (N-1)*K)} global row ids of the new positions; changes nothing."""
        local = self.hasher.hash_continuation(self.lookback, new_ids)
        return {layer: ids + self._offsets[layer] for layer, ids in local.items()}

    def step(self, new_ids) -> dict[int, np.ndarray]:
        """peek(), then the new ids become part of the lookback."""
        out = self.peek(new_ids)
        nxt = self.hasher.next_lookback(self.lookback, new_ids)
        # Keep only real ids: a sequence that has seen fewer than N-1 tokens keeps a short lookback, which
        # hash_continuation pads exactly as the full-sequence hash pads the start.
        seen = [min(self.width, len(lb) + len(new)) for lb, new in zip(self.lookback, new_ids)]
        self.lookback = [row[self.width - n :].tolist() if n else [] for row, n in zip(nxt, seen)]
        return out

    def to_list(self) -> list[list[int]]:
        return [list(r) for r in self.lookback]


class RowCache:
    """Least-recently-used RAM copies of disk rows, `capacity_rows` of them. Thread-safe."""

    def __init__(self, capacity_rows: int, dim: int, dtype: np.dtype):
        if capacity_rows < 1:
            raise UsageError(f"a row cache needs room for at least one row; got {capacity_rows}.")
        self.capacity_rows = int(capacity_rows)
        self._store = np.empty((self.capacity_rows, dim), dtype=dtype)
        self._slots: OrderedDict[int, int] = OrderedDict()  # row id -> slot, least recent first
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def take(self, ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Copy cached rows of `ids` into `out`; returns the positions (into ids) that missed."""
        hit_pos, hit_slot, miss = [], [], []
        with self._lock:
            for i, row in enumerate(ids.tolist()):
                slot = self._slots.get(row)
                if slot is None:
                    miss.append(i)
                else:
                    self._slots.move_to_end(row)
                    hit_pos.append(i)
                    hit_slot.append(slot)
            if hit_pos:
                out[hit_pos] = self._store[hit_slot]
            self.hits += len(hit_pos)
            self.misses += len(miss)
        return np.asarray(miss, dtype=np.int64)

    def put(self, ids: np.ndarray, rows: np.ndarray) -> None:
        with self._lock:
            for row, values in zip(ids.tolist(), rows):
                slot = self._slots.get(row)
                if slot is None:
                    if len(self._slots) < self.capacity_rows:
                        slot = len(self._slots)
                    else:
                        _, slot = self._slots.popitem(last=False)
                    self._slots[row] = slot
                else:
                    self._slots.move_to_end(row)
                self._store[slot] = values

    def __len__(self) -> int:
        return len(self._slots)


@dataclass
class StepStats:
    rows: int = 0  # row reads the step asked for, before dedupe
    unique_rows: int = 0
    cache_hits: int = 0
    gather_ms: float = 0.0  # summed over the threads that read
    wait_ms: float = 0.0  # how long the consumer blocked in wait()


@dataclass
class _Job:
    ids_shape: tuple[int, ...]
    unique: np.ndarray
    inverse: np.ndarray
    staging: np.ndarray
    chunks: list[tuple[int, int]]
    next_chunk: int = 0
    done_chunks: int = 0
    error: BaseException | None = None
    stats: StepStats = field(default_factory=StepStats)
    cond: threading.Condition = field(default_factory=threading.Condition)
    consumed: bool = False

    @property
    def finished(self) -> bool:
        return self.done_chunks == len(self.chunks)


class PendingRows:
    """The rows of one submitted step, being gathered."""

    def __init__(self, prefetcher: "Prefetcher", job: _Job):
        self._prefetcher, self._job = prefetcher, job

    @property
    def ready(self) -> bool:
        with self._job.cond:
            return self._job.finished

    @property
    def stats(self) -> StepStats:
        return self._job.stats

    def wait(self) -> np.ndarray:
        """(*ids.shape, D_h) rows in the table's storage dtype, a fresh array (the staging slot is reused
        two submits later). Reads the chunks no thread has started, then waits for those in flight."""
        job = self._job
        t0 = time.perf_counter()
        self._prefetcher._drain(job)
        with job.cond:
            while not job.finished and job.error is None:
                job.cond.wait()
            if job.consumed:
                raise UsageError("the rows of this step were already taken or their staging slot was reused.")
            job.consumed = True
        job.stats.wait_ms = (time.perf_counter() - t0) * 1000
        if job.error is not None:
            raise job.error
        return job.staging[job.inverse].reshape(*job.ids_shape, -1)


class Prefetcher:
    """Gathers the rows of a step from a table into staging, on `threads` gather threads (0: all reads
    happen in wait()/fetch() on the caller's thread)."""

    def __init__(
        self, source: RowSource, threads: int = 2, cache: RowCache | None = None, chunk_rows: int = CHUNK_ROWS
    ):
        self.source, self.cache, self.chunk_rows = source, cache, max(1, int(chunk_rows))
        spec = source.spec
        self.dim, self.dtype = spec.dim, spec.storage_dtype
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="ngram-prefetch") if threads > 0 else None
        self._threads = threads
        self._slots = [np.empty((0, self.dim), self.dtype), np.empty((0, self.dim), self.dtype)]
        self._slot_jobs: list[_Job | None] = [None, None]
        self._next_slot = 0

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _job(self, ids: np.ndarray) -> _Job:
        ids = np.asarray(ids, dtype=np.int64)
        unique, inverse = np.unique(ids.reshape(-1), return_inverse=True)
        slot = self._next_slot
        self._next_slot ^= 1
        old = self._slot_jobs[slot]
        if old is not None:  # its reads may still be writing into this slot: let them finish first
            self._drain(old)
            with old.cond:
                while not old.finished and old.error is None:
                    old.cond.wait()
                old.consumed = True
        if self._slots[slot].shape[0] < len(unique):
            self._slots[slot] = np.empty((max(len(unique), 2 * self._slots[slot].shape[0]), self.dim), self.dtype)
        staging = self._slots[slot][: len(unique)]
        n = len(unique)
        chunks = [(s, min(n, s + self.chunk_rows)) for s in range(0, n, self.chunk_rows)]
        job = _Job(ids.shape, unique, inverse, staging, chunks)
        job.stats.rows, job.stats.unique_rows = int(ids.size), n
        self._slot_jobs[slot] = job
        return job

    def submit(self, ids: np.ndarray) -> PendingRows:
        """Start gathering the rows of `ids` (any shape of global row ids) now, on the gather threads."""
        job = self._job(ids)
        if self._pool is not None:
            for _ in range(min(self._threads, len(job.chunks))):
                self._pool.submit(self._drain, job)
        return PendingRows(self, job)

    def fetch(self, ids: np.ndarray) -> np.ndarray:
        """Synchronous: gather now and return the rows (the no-prefetch path); the gather threads still
        share the reads of a large step."""
        return self.submit(ids).wait()

    def _drain(self, job: _Job) -> None:
        """Claim and read chunks of the job until none is left unclaimed."""
        while True:
            with job.cond:
                if job.next_chunk >= len(job.chunks) or job.error is not None:
                    return
                start, end = job.chunks[job.next_chunk]
                job.next_chunk += 1
            t0 = time.perf_counter()
            try:
                hits = self._read(job.unique[start:end], job.staging[start:end])
            except BaseException as e:  # handed to the consumer in wait()
                with job.cond:
                    job.error = e
                    job.cond.notify_all()
                return
            with job.cond:
                job.stats.gather_ms += (time.perf_counter() - t0) * 1000
                job.stats.cache_hits += hits
                job.done_chunks += 1
                if job.finished:
                    job.cond.notify_all()

    def _read(self, ids: np.ndarray, out: np.ndarray) -> int:
        if self.cache is None or self.source.resident:
            self.source.gather(ids, out)
            return 0
        miss = self.cache.take(ids, out)
        if len(miss):
            buf = np.empty((len(miss), self.dim), self.dtype)
            self.source.gather(ids[miss], buf)
            out[miss] = buf
            self.cache.put(ids[miss], buf)
        return len(ids) - len(miss)
