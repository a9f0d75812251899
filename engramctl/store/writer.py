"""The background write-through thread: one FIFO of jobs, done one at a time, in order.

One thread means two commits of one session reach the disk in commit order and never interleave.
`submit` blocks when `max_pending` jobs are queued (backpressure instead of unbounded memory);
`flush` waits until everything submitted so far is done. A job that raises is logged and the thread
carries on; the job itself is responsible for leaving the store consistent (see store/snapshots.py Snapshots._write).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Callable

log = logging.getLogger("engramctl.store")

Job = Callable[[], None]


class Writer:
    def __init__(self, name: str = "engram-writer", max_pending: int = 32):
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._pending = 0  # queued + running
        self._max = max_pending
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cond:
            while self._pending >= self._max and not self._closed:
                self._cond.wait()
            if self._closed:
                raise RuntimeError("the writer is closed")
            self._jobs.append(job)
            self._pending += 1
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        with self._cond:
            return self._pending

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted job has finished; False if `timeout` ran out first."""
        if threading.current_thread() is self._thread:
            return self._pending <= 1
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def wait_until(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait until `predicate()` holds, re-checking after each finished job."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Finish the queued jobs, then stop the thread. False if it did not stop in time."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return  # closed and drained
                job = self._jobs.popleft()
            try:
                job()
            except Exception:
                log.exception("background snapshot job failed")
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()
