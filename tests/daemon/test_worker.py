"""Worker.call: code without an event loop (the bench) runs on the daemon's worker thread, gets the result
or the error back, and is refused once the worker shuts down."""

from __future__ import annotations

import threading

import pytest

from engramctl.daemon.errors import ShuttingDown
from engramctl.daemon.worker import Worker
from engramctl.errors import NotFound


def test_call_runs_on_the_worker_thread_and_returns_its_result():
    worker = Worker(max_queue=0)
    try:
        where = worker.call(threading.get_ident)
        assert where != threading.get_ident()
        assert worker.call(threading.get_ident) == where  # always the same thread, as the daemon's jobs
        assert worker.call(lambda: 6 * 7) == 42
        assert worker.completed == 3
    finally:
        worker.close(5)


def test_call_raises_the_error_of_its_function():
    worker = Worker(max_queue=0)
    try:
        with pytest.raises(NotFound, match="no such thing"):
            worker.call(lambda: (_ for _ in ()).throw(NotFound("no such thing")))
        assert worker.call(lambda: "still serving") == "still serving"
    finally:
        worker.close(5)


def test_call_after_shutdown_is_refused():
    worker = Worker(max_queue=0)
    assert worker.close(5)
    with pytest.raises(ShuttingDown):
        worker.call(lambda: None)
