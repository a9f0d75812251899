"""A job: one unit of work for the worker thread, and the one way a route reads what it did.

    job = worker.submit(fn, name, turn=..., session=...)     # from the event loop
    async for kind, value in job.events(): ...               # "start", "piece", ..., "finish", then "done" or "error"
    result = await job.result()                              # or only its end: the result, or its error raised

`fn(job)` runs on the worker thread. A turn job's `fn` plans a turn (a daemon/sequence.py Sequence, which the
scheduler steps with the others); the conversation service hands the route the turn's events through
`emit` as they happen. Any other job's `fn` returns its result. Only the worker finishes a job (`finish`):
its result or its error is the last event, and the future of a caller without an event loop (Worker.call).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

END = ("done", "error")  # the kinds of a job's last event


@dataclass(frozen=True)
class Failed:
    """A turn cannot go on, or a job was refused: the error goes to whoever asked."""

    error: BaseException


@dataclass(frozen=True)
class Answered:
    """A turn job whose planning turned out to generate nothing (a restore without a continuation): its answer."""

    result: Any


class Deferred(Exception):
    """A turn job cannot be planned yet: raised by its `fn` at admission; the scheduler keeps it waiting, in
    its place, until `ready()` (a prefix state another turn is computing: daemon/prefix_states.py)."""

    def __init__(self, why: str, ready: Callable[[], bool]):
        super().__init__(why)
        self.ready = ready


class Job:
    def __init__(
        self,
        fn: Callable[["Job"], Any],
        name: str,
        loop: asyncio.AbstractEventLoop | None,
        *,
        turn: bool = False,
        session: str | None = None,
    ):
        self.fn, self.name, self.loop = fn, name, loop
        self.turn = turn  # fn plans a turn for the scheduler (a sequence.Sequence)
        self.session = session  # the named session the turn continues: it waits for that session's running turn
        self.future: concurrent.futures.Future | None = None  # Worker.call's: the result for a caller without a loop
        self.cancel = threading.Event()
        self.ready: Callable[[], bool] | None = None  # a Deferred turn job: admitted once this says so
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.submitted = time.monotonic()
        self.started: float | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    # -- the worker thread's side ------------------------------------------------------------------------
    def emit(self, kind: str, value: Any = None) -> None:
        """Thread-safe: hand an event to the route reading this job."""
        if self.loop is None:  # Worker.call: the caller waits for the result only
            return
        try:
            self.loop.call_soon_threadsafe(self._events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is gone (daemon stopping): nobody is listening
            pass

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """The job's end, to whoever waits: the route (its last event) or Worker.call's caller (the future).
        The worker's alone to call."""
        if error is None:
            self.emit("done", result)
        else:
            self.emit("error", error)
        if self.future is not None and error is None:
            self.future.set_result(result)
        elif self.future is not None:
            self.future.set_exception(error)

    # -- the event loop's side ---------------------------------------------------------------------------
    async def events(self) -> AsyncIterator[tuple[str, Any]]:
        """The job's events as (kind, value), up to and including its end ("done" with the result, or "error").
        Stopping early cancels nothing: a reader that goes away sets `cancel` itself."""
        while True:
            kind, value = await self._events.get()
            yield kind, value
            if kind in END:
                return

    async def result(self) -> Any:
        """The job's result, or its error raised here (the events before its end are skipped)."""
        async for kind, value in self.events():
            if kind == "error":
                raise value
            if kind == "done":
                return value
        raise RuntimeError("a job's events ended without its end")  # unreachable: events() ends on its end
