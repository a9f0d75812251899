"""The scheduler: every turn the daemon runs, stepped together on the engine (continuous batching).

    while scheduler.busy:                    # daemon/worker.py's loop, between other jobs
        scheduler.step()

    def step():
        self.admit()                          # waiting turns join, in arrival order, up to max_sequences
        work = self.schedule()                # one token per generating turn, then prompt chunks, within a budget
        logits = engine.step(work)            # one forward pass where the backend batches
        self.postprocess(work)                # sample, stream, stop; a finished turn settles and records

A turn is engine/turn.py's `Turn` (the same state machine a turn run alone uses, so a turn that runs alone
computes exactly what it always did) wrapped in a `TurnRequest`: its cancel event, and the service's
callbacks for its prompt (the stream's start, the prompt snapshot), its pieces and its end (the reply
snapshot, the transcript, the state kept hot: daemon/service.py). Admission runs the job's planning on
this thread (which state continues the prompt: daemon/state_cache.py), so a turn's state is acquired
only when it runs, and a session's next turn waits for the one it continues.

Cancel or disconnect: a turn still in its prompt stops before its next chunk (errors.Cancelled, nothing
recorded); a generating one ends at its next token ("cancelled", the partial reply recorded). Either way
its sequence is free at the next step. With `max_sequences` 1 (a backend that runs one Live at a time,
or ENGRAM_SERIAL_TURNS) turns run one after another in arrival order, each exactly as alone.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable

from engramctl.engine.engine import Engine
from engramctl.engine.generate import Finish
from engramctl.engine.turn import Prompt, Turn, TurnDone
from engramctl.errors import Cancelled, EngramError

if TYPE_CHECKING:
    from engramctl.daemon.worker import Job

log = logging.getLogger("engramctl.daemon")

# A burst's requests reach the worker milliseconds apart, the first one alone: a turn alone computes its whole
# prompt (share_prefix is for turns under load), so a long prompt that could start from a resident
# conversation's cells waits a little for company first: at most this share of its own compute, and this long.
COMPANY_WAIT_SHARE = 0.005
COMPANY_WAIT_MAX_S = 0.02
RATE_MIN_TOKENS = 32  # a step this big is mostly prompt: its seconds per token estimate a prompt's compute


class TurnRequest:
    """One planned turn and what its ends do. The service builds it (`on_start`, `on_prompt`, `on_piece`, `on_finish`,
    `on_done`: the turn's result from its TurnDone); `then(fn)` maps that result for the route that asked."""

    def __init__(
        self,
        turn: Turn,
        cancel: threading.Event,
        *,
        on_prompt: Callable[[Prompt], None],
        on_piece: Callable[[str], None],
        on_done: Callable[[TurnDone], Any],
        on_fail: Callable[[], None],
        on_finish: Callable[[Finish], None] | None = None,
        on_start: Callable[[Prompt], None] | None = None,
        session: str | None = None,
        needs: Callable[[], str | None] | None = None,
    ):
        self.turn, self.cancel, self.session = turn, cancel, session
        self.needs = needs or (lambda: None)  # the snapshot its next record continues from (a delete waits)
        self.on_prompt, self.on_piece, self.on_done, self.on_fail = on_prompt, on_piece, on_done, on_fail
        self.on_start = on_start  # the prompt is in the state: the stream's first chunk, before the first token
        self.on_finish = on_finish  # generation stopped: the stream's last choice goes before the state is recorded
        self._then: list[Callable[[Any], Any]] = []
        self.job: "Job | None" = None
        self.result: Any = None
        self.error: BaseException | None = None

    def then(self, fn: Callable[[Any], Any]) -> "TurnRequest":
        self._then.append(fn)
        return self

    def begin(self) -> None:
        self.turn.begin(
            self.cancel,
            on_start=self.on_start,
            on_prompt=self.on_prompt,
            on_piece=self.on_piece,
            on_finish=self.on_finish,
        )

    def succeed(self) -> None:
        result = self.on_done(self.turn.done)
        for fn in self._then:
            result = fn(result)
        self.result = result
        if self.job is not None:
            self.job.finish(result)

    def fail(self, error: BaseException) -> None:
        """The turn cannot go on: its half-fed Live is released, the error goes to whoever asked."""
        try:
            self.turn.abort()
            self.on_fail()
        finally:
            self.error = error
            if self.job is not None:
                self.job.finish(error=error)

    def run(self) -> Any:
        """Run this turn alone, on this thread (the benchmark; tests): its result, or its error raised."""
        scheduler = Scheduler(self.turn.engine, max_sequences=1)
        scheduler.start(self)
        while scheduler.busy:
            scheduler.step()
        if self.error is not None:
            raise self.error
        return self.result


class Scheduler:
    def __init__(self, engine: Engine, *, max_sequences: int | None = None, serial: bool = False):
        self.engine = engine
        self.max_sequences = 1 if serial else max(1, max_sequences or engine.max_sequences)
        self.waiting: collections.deque["Job"] = collections.deque()  # turn jobs, in arrival order
        self.running: list[TurnRequest] = []
        self.budget = engine.step_tokens  # tokens one step feeds in all (schedule)
        self.steps = 0
        self.prompt_s_per_token: float | None = None  # measured on the last step of RATE_MIN_TOKENS or more
        self._waited: weakref.ref[TurnRequest] | None = None  # the lone turn company_wait_s was asked for (a
        # weak reference: a finished turn's Live must not stay alive, and resident, through it)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, job: "Job") -> None:
        """Queue a turn job: `job.fn(job)` plans the turn (a TurnRequest) when the turn is admitted."""
        self.waiting.append(job)

    def step(self) -> None:
        self.admit()
        work = self.schedule()
        if work:
            t0 = time.perf_counter()
            try:
                self.engine.step([(r.turn.live, tokens) for r, tokens in work])
            except BaseException as e:  # noqa: BLE001 - the turns of a failed step cannot go on
                if not isinstance(e, EngramError):
                    log.exception("a step of %d turn(s) failed", len(work))
                for r, _ in work:
                    self._drop(r, e)
                return
            fed = sum(len(tokens) for _, tokens in work)
            if fed >= RATE_MIN_TOKENS:
                self.prompt_s_per_token = (time.perf_counter() - t0) / fed
            self.postprocess(work)
        self.steps += 1

    def company_wait_s(self) -> float:
        """How long the worker may wait for another turn before stepping one that would run alone, once per
        such turn: > 0 only for a lone turn whose prompt could start from a resident conversation's cells
        (COMPANY_WAIT_SHARE of its prompt's compute at the last measured rate, at most COMPANY_WAIT_MAX_S)."""
        if len(self.running) != 1 or self.waiting or self.max_sequences < 2 or self.prompt_s_per_token is None:
            return 0.0
        r = self.running[0]
        if (self._waited is not None and self._waited() is r) or not r.turn.prefilling:
            return 0.0
        self._waited = weakref.ref(r)
        if not r.turn.shareable():
            return 0.0
        return min(COMPANY_WAIT_MAX_S, COMPANY_WAIT_SHARE * r.turn.prompt_left * self.prompt_s_per_token)

    def admit(self) -> int:
        """Waiting jobs start in arrival order: a turn while there is room, after its session's previous turn
        (it continues that one's state); a job that reads a session's head (a checkpoint, a branch) right
        after the turns of that session queued before it, needing no room. Returns how many turns started."""
        started = 0
        gone = [job for job in self.waiting if job.cancelled]  # their clients went away: no place in line
        if gone:
            self.waiting = collections.deque(job for job in self.waiting if not job.cancelled)
            for job in gone:
                job.finish(error=Cancelled("the request was cancelled before it started."))
        kept: collections.deque["Job"] = collections.deque()
        held = {r.session for r in self.running if r.session is not None}  # sessions whose next job waits
        reads = sum(not job.turn for job in self.waiting)  # jobs that need no room
        while self.waiting:
            full = len(self.running) >= self.max_sequences
            if full and not reads:
                break
            job = self.waiting.popleft()
            reads -= not job.turn
            if (job.session is not None and job.session in held) or (job.turn and full):
                kept.append(job)
                if job.session is not None:
                    held.add(job.session)
                continue
            try:
                out = job.fn(job)
            except BaseException as e:  # noqa: BLE001 - a refused turn goes back to its request
                if not isinstance(e, EngramError):
                    log.exception("%s failed", job.name)
                job.finish(error=e)
                continue
            if not isinstance(out, TurnRequest):  # a job that turned out to generate nothing, or reads a head
                job.finish(out)
                continue
            out.job = job
            self.start(out)
            started += 1
        self.waiting.extendleft(reversed(kept))
        return started

    def holds(self, session: str) -> bool:
        """Does a turn of `session` run or wait here (a job reading its head must come after it)?"""
        return any(r.session == session for r in self.running) or any(j.session == session for j in self.waiting)

    def start(self, r: TurnRequest) -> None:
        """`r` starts running (its first token may be sampled at once, with nothing to feed)."""
        try:
            r.begin()
        except BaseException as e:  # noqa: BLE001
            r.fail(e)
            return
        self.running.append(r)
        if r.turn.done is not None:
            self._finish(r)

    def schedule(self) -> list[tuple[TurnRequest, list[int]]]:
        """This step's tokens, within the step's budget (the engine's step_tokens: one llama_decode): each
        generating turn's one token first, then prompt chunks in arrival order with what is left (at most
        the engine's prompts_per_step of them), so a long prompt delays the others' next token by one chunk
        at most. A turn running alone takes whole chunks (it
        computes what it computes alone); under load a prompt's first chunk may start from another resident
        conversation's cells (Turn.share_prefix); a prompt that finds no room waits for the next step. A turn cancelled
        in its prompt leaves here, before its next chunk."""
        work, prompts = [], []
        for r in list(self.running):
            if not r.turn.prefilling:
                work.append((r, r.turn.work()))
            elif r.cancel.is_set():  # between chunks: the state holds whole chunks
                self._drop(r, Cancelled("the request was cancelled during the prompt prefill."))
            else:
                prompts.append(r)
        room = None if len(self.running) == 1 or self.budget is None else self.budget - len(work)
        for r in prompts[: self.engine.prompts_per_step]:
            if room is not None and room <= 0:
                break
            if len(self.running) > 1:  # under load; a turn alone computes its whole prompt, as always
                r.turn.share_prefix()
            tokens = r.turn.work(room)
            work.append((r, tokens))
            if room is not None:
                room -= len(tokens)
        return work

    def postprocess(self, work: list[tuple[TurnRequest, list[int]]]) -> None:
        for r, _ in work:
            try:
                r.turn.fed()
            except BaseException as e:  # noqa: BLE001
                if not isinstance(e, EngramError):
                    log.exception("a turn failed")
                self._drop(r, e)
                continue
            if r.turn.done is not None:
                self._finish(r)

    def cancel_all(self) -> None:
        """The daemon stops: every running turn ends at its next step."""
        for r in self.running:
            r.cancel.set()

    def _finish(self, r: TurnRequest) -> None:
        self.running.remove(r)
        try:
            r.succeed()
        except BaseException as e:  # noqa: BLE001 - a failure after the turn still answers its request
            log.exception("recording a turn failed")
            r.error = e
            if r.job is not None:
                r.job.finish(error=e)

    def _drop(self, r: TurnRequest, error: BaseException) -> None:
        if r in self.running:
            self.running.remove(r)
        r.fail(error)
