"""The one thread that runs the model: the scheduler's step loop, and every other job between steps.

Routes submit a job (daemon/job.py) from the event loop and read its events (`start`, `piece`, ..., then
`done` or `error`: `job.events()`), which this thread hands over. A turn job (`turn=True`: it plans a turn)
joins the scheduler (daemon/scheduler.py), which admits it in arrival order and steps it with the other
turns; each event a step returns goes to the conversation service (`service.handle`), and the worker finishes
the job at the turn's end. Any other job (a save, a restore, a reset) runs between two steps, first come, first
served. Only this thread finishes jobs.
At most `max_queue` jobs wait (not yet started); one more is refused at once (QueueFull -> 429) rather
than queued without bound: it bounds memory, not ordinary bursts. Each job has a cancel event: set it
(client gone, daemon stopping) and the job stops between tokens, or is skipped if it has not started.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from engramctl.daemon.errors import Cancelled, QueueFull, ShuttingDown
from engramctl.daemon.job import Answered, Failed, Job
from engramctl.engine.turn import Event, TurnDone
from engramctl.errors import EngramError

if TYPE_CHECKING:
    from engramctl.daemon.scheduler import Scheduler
    from engramctl.daemon.sequence import Sequence
    from engramctl.daemon.service import ConversationService

log = logging.getLogger("engramctl.daemon")


class Worker:
    def __init__(self, max_queue: int, scheduler: Scheduler | None = None, service: ConversationService | None = None):
        """`service` handles the events of the scheduler's turns (its `handle`); both or neither."""
        self.max_queue = max(0, int(max_queue))
        self.scheduler, self.service = scheduler, service
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._accepting = True
        self.current: Job | None = None
        self.completed = 0
        self._thread = threading.Thread(target=self._run, name="engram-worker", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Jobs not started yet: queued here, or turns the scheduler has not admitted."""
        with self._lock:
            return self._waiting + self._admitting()

    def _admitting(self) -> int:
        return 0 if self.scheduler is None else self.scheduler.n_waiting

    @property
    def running(self) -> int:
        """Turns the scheduler is stepping."""
        return 0 if self.scheduler is None else self.scheduler.n_running

    @property
    def busy(self) -> bool:
        return self.current is not None or self.running > 0

    def submit(
        self, fn: Callable[[Job], Any], name: str = "job", *, turn: bool = False, session: str | None = None
    ) -> Job:
        """Queue `fn`; call from the event loop. Raises QueueFull or ShuttingDown instead of waiting.
        turn=True: `fn` plans a turn (it returns a sequence.Sequence), run by the scheduler with the
        others; `session` names the session it continues. A job that is not a turn but names a `session`
        (a checkpoint, a branch of it) runs after that session's turns running or queued now: it sees their
        replies."""
        job = Job(fn, name, asyncio.get_running_loop(), turn=turn, session=session)
        with self._lock:
            if not self._accepting:
                raise ShuttingDown("the daemon is shutting down.")
            waiting = self._waiting + self._admitting()
            if waiting >= self.max_queue and (self.busy or waiting > 0):
                raise QueueFull(
                    f"the daemon is busy: {waiting} request(s) already wait for the model.",
                    hint="retry in a moment, or raise max_queue (ENGRAM_MAX_QUEUE)",
                )
            self._waiting += 1
            self._queue.put(job)
        return job

    def call(self, fn: Callable[[], Any], name: str = "call") -> Any:
        """Run `fn()` on the worker thread, after the jobs already queued, and return its result (or raise its
        error). For callers without an event loop: the bench decodes exactly where the daemon does."""
        job = Job(lambda _job: fn(), name, None)
        job.future = concurrent.futures.Future()
        with self._lock:
            if not self._accepting:
                raise ShuttingDown("the daemon is shutting down.")
            self._waiting += 1
            self._queue.put(job)
        return job.future.result()

    def begin_shutdown(self) -> None:
        """Stop accepting; cancel the running job and everything queued."""
        with self._lock:
            self._accepting = False
            current = self.current
            pending = []
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    pending.append(job)
            self._waiting = 0
            self._queue.put(None)
        if current is not None:
            current.cancel.set()
        for job in pending:
            job.cancel.set()
            job.finish(error=ShuttingDown("the daemon is shutting down."))

    def close(self, timeout: float | None = None) -> bool:
        """begin_shutdown, then wait for the running job; False if it did not finish in time."""
        self.begin_shutdown()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        """Take every job queued now (waiting for one only when no turn is running), then step the turns."""
        stopping = False
        while True:
            busy = self.scheduler is not None and self.scheduler.busy
            wait = self.scheduler.company_wait_s() if busy and not stopping else 0.0
            try:
                if wait:
                    job = self._queue.get(timeout=wait)
                else:
                    job = self._queue.get(block=not busy and not stopping, timeout=None)
            except queue.Empty:
                job = None if stopping else False
            if job is None:  # begin_shutdown: the turns end at their next token, the waiting ones are refused
                stopping = True
                self._stop_turns()
                if not (self.scheduler is not None and self.scheduler.busy):
                    return
            elif job is not False:
                with self._lock:
                    self._waiting -= 1
                if self.scheduler is not None and not stopping and (job.turn or self._after_turns(job)):
                    self.scheduler.add(job)
                else:
                    self._run_job(job)
                continue  # take what else is queued before the next step
            if self.scheduler is not None and self.scheduler.busy:
                ended, started = self.scheduler.admit()
                for job, end in ended:
                    finish(job, end)
                # Planning a turn takes milliseconds, in which more of a burst arrives: those join this step
                # (the queue is read again, Scheduler.company_wait_s) rather than the next, seconds of prompt later.
                if started:
                    continue
                for seq, event in self.scheduler.step():
                    deliver(self.service, seq, event)

    def _after_turns(self, job: Job) -> bool:
        """A job that reads a session's head waits for that session's turns (run by the scheduler after them)."""
        return job.session is not None and self.scheduler is not None and self.scheduler.holds(job.session)

    def _stop_turns(self) -> None:
        if self.scheduler is not None:
            for job in self.scheduler.shutdown():
                job.finish(error=ShuttingDown("the daemon is shutting down."))

    def _run_job(self, job: Job) -> None:
        with self._lock:
            self.current = job
        try:
            if job.cancelled:
                job.finish(error=Cancelled("the request was cancelled before it started."))
                return
            job.started = time.monotonic()
            job.finish(job.fn(job))
        except BaseException as e:  # noqa: BLE001 - every failure goes back to its request
            if not isinstance(e, EngramError):
                log.exception("%s failed", job.name)
            job.finish(error=e)
        finally:
            with self._lock:
                self.current = None
                self.completed += 1


def deliver(service: ConversationService, seq: Sequence, event: Event | Failed) -> None:
    """Hand one event of a turn to the service (`handle`); at the turn's end, finish its job."""
    result = None
    try:
        result = service.handle(seq, event)
    except BaseException as e:  # noqa: BLE001 - a failure after the turn still answers its request
        log.exception("handling a turn's %s failed", type(event).__name__)
        if isinstance(event, TurnDone):
            event = Failed(e)
        elif not isinstance(event, Failed):
            seq.error = e  # the scheduler drops the turn before its next step
    if seq.job is not None and isinstance(event, Failed):
        seq.job.finish(error=event.error)
    elif seq.job is not None and isinstance(event, TurnDone):
        seq.job.finish(result)


def finish(job: Job, end: Failed | Answered) -> None:
    """A job that ended at admission (Scheduler.admit): refused, cancelled, or answered without a turn."""
    if isinstance(end, Failed):
        job.finish(error=end.error)
    else:
        job.finish(end.result)
