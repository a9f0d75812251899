"""The scheduler: every turn the daemon runs, stepped together on the engine (continuous batching).

    ended, started = scheduler.admit()        # waiting turns join, in arrival order, up to max_sequences
    for seq, event in scheduler.step():       # daemon/worker.py's loop, between other jobs
        service.handle(seq, event)            # ... and the worker finishes the job at Done / Failed

    def step():
        work = self.schedule()                # one token per generating turn, then prompt chunks, within a budget
        engine.step(work)                     # one forward pass where the backend batches
        for each turn fed: yield its events   # sample, stream, stop; a finished turn settles (TurnDone)

A turn is a daemon/sequence.py `Sequence`: the engine's `Turn` (engine/turn.py: the same state machine a turn
run alone uses, so a turn that runs alone computes exactly what it always did) with what the service records of
it. The scheduler calls nobody back: a step returns each turn's events (engine/turn.py's, and `Failed` for a turn
that cannot go on), which the worker hands to the conversation service. Admission runs the job's planning on
this thread (which state continues the prompt: daemon/state_cache.py), so a turn's state is acquired only when
it runs, and a session's next turn waits for the one it continues. The scheduler alone touches its queues; what
the worker and the routes need of them are its methods (counts, `shutdown`, `session_busy`, `continuing_from`).

Cancel or disconnect: a turn still in its prompt stops before its next chunk (errors.Cancelled, nothing
recorded); a generating one ends at its next token ("cancelled", the partial reply recorded). Either way
its sequence is free at the next step. With `max_sequences` 1 (a backend that runs one Live at a time,
or ENGRAM_SERIAL_TURNS) turns run one after another in arrival order, each exactly as alone.
"""

from __future__ import annotations

import collections
import logging
import time
import weakref
from typing import Iterator

from engramctl.daemon.job import Answered, Deferred, Failed, Job
from engramctl.daemon.sequence import Sequence
from engramctl.engine.engine import Engine
from engramctl.engine.turn import Event, TurnDone
from engramctl.errors import Cancelled, EngramError

log = logging.getLogger("engramctl.daemon")

# A burst's requests reach the worker milliseconds apart, the first one alone: a turn alone computes its whole
# prompt (share_prefix is for turns under load), so a long prompt that could start from a resident
# conversation's cells waits a little for company first: at most this share of its own compute, and this long.
COMPANY_WAIT_SHARE = 0.005
COMPANY_WAIT_MAX_S = 0.02
RATE_MIN_TOKENS = 32  # a step this big is mostly prompt: its seconds per token estimate a prompt's compute


class Scheduler:
    def __init__(self, engine: Engine, *, max_sequences: int | None = None, serial: bool = False):
        self.engine = engine
        self.max_sequences = 1 if serial else max(1, max_sequences or engine.max_sequences)
        self.waiting: collections.deque[Job] = collections.deque()  # turn jobs, in arrival order
        self.running: list[Sequence] = []
        self.budget = engine.step_tokens  # tokens one step feeds in all (schedule)
        self.steps = 0
        self.prompt_s_per_token: float | None = None  # measured on the last step of RATE_MIN_TOKENS or more
        self._waited: weakref.ref[Sequence] | None = None  # the lone turn company_wait_s was asked for (a
        # weak reference: a finished turn's Live must not stay alive, and resident, through it)

    # -- what the worker and the routes read -----------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def n_waiting(self) -> int:
        return len(self.waiting)

    @property
    def n_running(self) -> int:
        return len(self.running)

    def holds(self, session: str) -> bool:
        """Does a turn of `session` run or wait here (a job reading its head must come after it)?"""
        return self.session_busy(session) is not None

    def session_busy(self, session: str) -> str | None:
        """ "running" or "waiting to run" while a turn of `session` does (None: neither)."""
        if any(seq.session == session for seq in self.running):
            return "running"
        return "waiting to run" if any(job.session == session for job in self.waiting) else None

    def continuing_from(self, snapshot_id: str) -> Sequence | None:
        """The running turn that records onto `snapshot_id` (Sequence.needs), if any."""
        return next((seq for seq in self.running if seq.needs() == snapshot_id), None)

    # -- admission -------------------------------------------------------------------------------------------
    def add(self, job: Job) -> None:
        """Queue a turn job: `job.fn(job)` plans the turn (a Sequence) when the turn is admitted."""
        self.waiting.append(job)

    def admit(self) -> tuple[list[tuple[Job, Failed | Answered]], int]:
        """Waiting jobs start in arrival order: a turn while there is room, after its session's previous turn
        (it continues that one's state); a job that reads a session's head (a checkpoint, a branch) right
        after the turns of that session queued before it, needing no room. Returns the jobs that ended here,
        for the worker to finish (cancelled, refused, or answered without a turn), and how many turns started."""
        ended: list[tuple[Job, Failed | Answered]] = []
        started = 0
        gone = [job for job in self.waiting if job.cancelled]  # their clients went away: no place in line
        if gone:
            self.waiting = collections.deque(job for job in self.waiting if not job.cancelled)
            ended += [(job, Failed(Cancelled("the request was cancelled before it started."))) for job in gone]
        kept: collections.deque[Job] = collections.deque()
        held = {seq.session for seq in self.running}  # sessions whose next job waits
        reads = sum(not job.turn for job in self.waiting)  # jobs that need no room
        while self.waiting:
            full = len(self.running) >= self.max_sequences
            if full and not reads:
                break
            job = self.waiting.popleft()
            reads -= not job.turn
            # a deferred job waits while the turn it waits for runs (with none running, nothing will come)
            waits = job.ready is not None and bool(self.running) and not job.ready()
            if (job.session is not None and job.session in held) or (job.turn and full) or waits:
                kept.append(job)
                if job.session is not None:
                    held.add(job.session)
                continue
            try:
                out = job.fn(job)
            except Deferred as d:  # it waits for a state another turn is computing: its place is kept
                job.ready = d.ready
                kept.append(job)
                if job.session is not None:
                    held.add(job.session)
                continue
            except BaseException as e:  # noqa: BLE001 - a refused turn goes back to its request
                if not isinstance(e, EngramError):
                    log.exception("%s failed", job.name)
                ended.append((job, Failed(e)))
                continue
            if not isinstance(out, Sequence):  # a job that turned out to generate nothing, or reads a head
                ended.append((job, Answered(out)))
                continue
            out.job = job
            self.start(out)
            started += 1
            if job.session is not None:  # its session's next job, queued behind it, waits for it
                held.add(job.session)
        self.waiting.extendleft(reversed(kept))
        return ended, started

    def start(self, seq: Sequence) -> None:
        """`seq` starts running: its turn owns its Live from here on (a turn with nothing to feed samples its
        first token at the next step). A turn that cannot begin leaves at the next step, with its error."""
        try:
            seq.turn.begin(seq.cancel)
        except BaseException as e:  # noqa: BLE001 - it fails through the step, as every turn that cannot go on
            seq.error = e
        self.running.append(seq)

    def shutdown(self) -> list[Job]:
        """The daemon stops: every running turn ends at its next step; the waiting jobs leave the queue, cancelled
        (the worker refuses them)."""
        for seq in self.running:
            seq.cancel.set()
        jobs = list(self.waiting)
        self.waiting.clear()
        for job in jobs:
            job.cancel.set()
        return jobs

    # -- a step ----------------------------------------------------------------------------------------------
    def step(self) -> Iterator[tuple[Sequence, Event | Failed]]:
        """One forward pass over this step's work, and each turn's events (a generator: the turns move on as it
        is read, so read it to its end). A turn that cannot go on leaves with Failed; one that ended, with
        its TurnDone."""
        yield from self._leave()
        work = self.schedule()
        if work:
            fed = [(seq, tokens) for seq, tokens in work if tokens]
            t0 = time.perf_counter()
            try:
                if fed:
                    self.engine.step([(seq.turn.live, tokens) for seq, tokens in fed])
            except BaseException as e:  # noqa: BLE001 - the turns of a failed step cannot go on
                if not isinstance(e, EngramError):
                    log.exception("a step of %d turn(s) failed", len(fed))
                for seq, _ in work:
                    yield self._drop(seq, e)
                self.steps += 1
                return
            n_fed = sum(len(tokens) for _, tokens in fed)
            if n_fed >= RATE_MIN_TOKENS:
                self.prompt_s_per_token = (time.perf_counter() - t0) / n_fed
            for seq, _ in work:
                yield from self._postprocess(seq)
        self.steps += 1

    def company_wait_s(self) -> float:
        """How long the worker may wait for another turn before stepping one that would run alone, once per
        such turn: > 0 only for a lone turn whose prompt could start from a resident conversation's cells
        (COMPANY_WAIT_SHARE of its prompt's compute at the last measured rate, at most COMPANY_WAIT_MAX_S)."""
        if len(self.running) != 1 or self.waiting or self.max_sequences < 2 or self.prompt_s_per_token is None:
            return 0.0
        seq = self.running[0]
        if (self._waited is not None and self._waited() is seq) or not seq.turn.prefilling:
            return 0.0
        self._waited = weakref.ref(seq)
        if not seq.turn.shareable():
            return 0.0
        return min(COMPANY_WAIT_MAX_S, COMPANY_WAIT_SHARE * seq.turn.prompt_left * self.prompt_s_per_token)

    def schedule(self) -> list[tuple[Sequence, list[int]]]:
        """This step's tokens, within the step's budget (the engine's step_tokens: one llama_decode): each
        generating turn's one token first, then prompt chunks in arrival order with what is left (at most
        the engine's prompts_per_step of them), so a long prompt delays the others' next token by one chunk
        at most. A turn running alone takes whole chunks (it computes what it computes alone); under load a
        prompt's first chunk may start from another resident conversation's cells (Turn.share_prefix); a prompt
        that finds no room waits for the next step. A turn whose prompt is in with nothing to feed is scheduled
        with no tokens: its first token is sampled after the step."""
        work, prompts = [], []
        for seq in self.running:
            if seq.turn.prefilling:
                prompts.append(seq)
            else:
                work.append((seq, seq.turn.work()))
        generating = sum(len(tokens) for _, tokens in work)  # one token each (none: a first token to sample)
        room = None if len(self.running) == 1 or self.budget is None else self.budget - generating
        for seq in prompts[: self.engine.prompts_per_step]:
            if room is not None and room <= 0:
                break
            if len(self.running) > 1:  # under load; a turn alone computes its whole prompt, as always
                seq.turn.share_prefix()
            tokens = seq.turn.work(room)
            work.append((seq, tokens))
            if room is not None:
                room -= len(tokens)
        return work

    def _leave(self) -> Iterator[tuple[Sequence, Failed]]:
        """Before a step: a turn cancelled in its prompt leaves before its next chunk (the state holds whole
        chunks), and so does one whose event could not be handled (Sequence.error)."""
        for seq in list(self.running):
            if seq.error is not None:
                yield self._drop(seq, seq.error)
            elif seq.turn.prefilling and seq.cancel.is_set():
                yield self._drop(seq, Cancelled("the request was cancelled during the prompt prefill."))

    def _postprocess(self, seq: Sequence) -> Iterator[tuple[Sequence, Event | Failed]]:
        """The events of a turn the step fed; it leaves at its TurnDone, or when it fails (or handling one of
        its events did: Sequence.error)."""
        events = seq.turn.fed()
        while True:
            try:
                event = next(events)
            except StopIteration:
                return
            except BaseException as e:  # noqa: BLE001 - the turn cannot go on; the others can
                if not isinstance(e, EngramError):
                    log.exception("a turn failed")
                yield self._drop(seq, e)
                return
            if isinstance(event, TurnDone):
                self.running.remove(seq)
            yield seq, event
            if seq.error is not None and seq in self.running:
                events.close()
                yield self._drop(seq, seq.error)
                return

    def _drop(self, seq: Sequence, error: BaseException) -> tuple[Sequence, Failed]:
        """The turn cannot go on: its half-fed Live is released, the error goes to whoever asked."""
        if seq in self.running:
            self.running.remove(seq)
        try:
            seq.turn.abort()
        except BaseException:  # noqa: BLE001 - releasing must not hide the error that ended the turn
            log.exception("releasing a failed turn's state failed")
        return seq, Failed(error)
