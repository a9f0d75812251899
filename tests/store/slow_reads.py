"""A store whose file reads are held until the test releases them, and counted: how tests see that two loads of one
snapshot at the same time read it once (tests/store/test_inflight.py, tests/daemon/test_prefetch.py)."""

from __future__ import annotations

import threading


class SlowReads:
    """Wraps the store's file read (store._files.read): counts the reads (of snapshot `only`, when given: the others
    pass at once) and holds each until `release` is set."""

    def __init__(self, store, fail: BaseException | None = None, only: str | None = None):
        self.files, self.read_of = store._files, store._files.read
        self.reads, self.fail, self.only = 0, fail, only
        self.started, self.release = threading.Event(), threading.Event()
        self.files.read = self._read

    def _read(self, sid, *a, **kw):
        if self.only is None or sid == self.only:
            self.reads += 1
            self.started.set()
            assert self.release.wait(30), "the test never released the read"
            if self.fail is not None:
                raise self.fail
        return self.read_of(sid, *a, **kw)
