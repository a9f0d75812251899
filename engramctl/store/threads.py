"""The process's long-lived worker pools (the store's readers, the prefix-state keeper, the buffer preparer): each
made on first use with all its threads started at once, so that a daemon's thread count is the same after its first
use as after its thousandth (the soak test holds it to that) and no thread starts inside a turn."""

from __future__ import annotations

import concurrent.futures
import threading


class Workers:
    """`workers()` is the process's one pool of `n` threads named `name`-N."""

    def __init__(self, n: int, name: str):
        self.n, self.name = n, name
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __call__(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                pool = concurrent.futures.ThreadPoolExecutor(self.n, thread_name_prefix=self.name)
                started = threading.Barrier(self.n)  # each waits for the others: the pool starts a thread per job
                for _ in range(self.n):
                    pool.submit(started.wait)
                self._pool = pool
            return self._pool
