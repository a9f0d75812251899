"""The scheduler's policy (daemon/scheduler.py), without a model: which turns run, in what order, with how many
tokens a step, and how they leave. The engine and the turns are stand-ins that record what they were fed (as
ollama tests its scheduler with injected fakes); tests/daemon/test_scheduler.py runs the same scheduler on real
models, where what matters is that every turn computes exactly what it computes alone.
"""

from __future__ import annotations

import threading

from engramctl.daemon.job import Answered, Failed, Job
from engramctl.daemon.recorder import TurnRecord
from engramctl.daemon.scheduler import Scheduler
from engramctl.daemon.sequence import Sequence
from engramctl.daemon.state_cache import Origin
from engramctl.engine.turn import TurnDone
from engramctl.errors import Cancelled, EngramError


class FakeEngine:
    """Steps whatever it is given; `steps` is each step's (turn name, tokens fed)."""

    def __init__(self, max_sequences: int = 4, step_tokens: int | None = 16, prompts_per_step: int | None = None):
        self.max_sequences, self.step_tokens, self.prompts_per_step = max_sequences, step_tokens, prompts_per_step
        self.steps: list[list[tuple[str, int]]] = []
        self.fail_next = False

    def step(self, work):
        if self.fail_next:
            self.fail_next = False
            raise EngramError("the step failed")
        self.steps.append([(live.name, len(tokens)) for live, tokens in work])
        return [None] * len(work)


class FakeLive:
    def __init__(self, name: str):
        self.name, self.released = name, False


class FakeTurn:
    """A turn with a prompt of `prompt` tokens (cut at the engine's chunk, or the step's room) and a reply of
    `reply` tokens; its events are ("token", name) per reply token, then its TurnDone. It ends "cancelled" at its
    next token once cancelled, as the engine's turn does."""

    def __init__(self, engine: FakeEngine, name: str, prompt: int, reply: int):
        self.engine, self.name, self.live = engine, name, FakeLive(name)
        self._left, self._reply, self._chunk = prompt, reply, 0
        self.sampled, self.done = 0, None

    def begin(self, cancel: threading.Event) -> None:
        self.cancel = cancel

    @property
    def prefilling(self) -> bool:
        return self._left > 0

    @property
    def prompt_left(self) -> int:
        return self._left

    def share_prefix(self) -> None:
        pass

    def shareable(self) -> int:
        return 0

    def work(self, room: int | None = None) -> list[int]:
        if self._left:
            n = min(self._left, self.engine.step_tokens or self._left)
            self._chunk = n if room is None else min(n, room)
            return [0] * self._chunk
        return [0]

    def fed(self):
        if self._left:
            self._left -= self._chunk
            if self._left:
                return
        if self.cancel.is_set() or self.sampled == self._reply:
            self.done = _done("cancelled" if self.cancel.is_set() else "length")
            yield self.done
            return
        self.sampled += 1
        yield ("token", self.name)

    def abort(self) -> None:
        self.live.released = True


def _done(reason: str) -> TurnDone:
    return TurnDone(None, reason, None, None, None, 0.0, 0.0, 0.0)


def _seq(engine: FakeEngine, name: str, prompt: int = 4, reply: int = 3, session: str | None = None) -> Sequence:
    turn = FakeTurn(engine, name, prompt, reply)
    return Sequence(turn, session or name, Origin(), TurnRecord(session or name, None, []), 0.0)


def _job(engine: FakeEngine, name: str, prompt: int = 4, reply: int = 3, session: str | None = None, planned=None):
    """A turn job; `planned` (a list) hears its name when it is planned (admitted)."""

    def plan(job: Job) -> Sequence:
        if planned is not None:
            planned.append(name)
        return _seq(engine, name, prompt, reply, session)

    return Job(plan, name, None, turn=True, session=session)


def _drive(s: Scheduler, steps: int | None = None) -> list[tuple[str, object]]:
    """The worker's loop: admit, step; every end as (name, how): a TurnDone's reason, a Failed's error, an
    Answered's result."""
    ends: list[tuple[str, object]] = []
    n = 0
    while s.busy and (steps is None or n < steps):
        admitted, _ = s.admit()
        ends += [(job.name, end.error if isinstance(end, Failed) else end.result) for job, end in admitted]
        for seq, event in s.step():
            if isinstance(event, TurnDone):
                ends.append((seq.turn.name, event.finish))
            elif isinstance(event, Failed):
                ends.append((seq.turn.name, event.error))
        n += 1
    return ends


def test_turns_are_admitted_in_arrival_order_up_to_max_sequences():
    engine = FakeEngine(max_sequences=2)
    s, planned = Scheduler(engine), []
    for name in "abcde":
        s.add(_job(engine, name, planned=planned))
    _, started = s.admit()
    assert started == 2 and planned == ["a", "b"] and s.n_running == 2 and s.n_waiting == 3
    ends = _drive(s)
    assert planned == list("abcde")  # planned only when admitted, in arrival order
    assert [name for name, _ in ends] == list("abcde")  # equal turns: first come, first done
    assert all(how == "length" for _, how in ends)


def test_a_step_feeds_every_generating_turn_its_token_first_then_prompt_chunks_within_the_budget():
    engine = FakeEngine(max_sequences=3, step_tokens=16)
    s = Scheduler(engine)
    s.start(_seq(engine, "gen", prompt=2, reply=20))
    _drive(s, steps=1)  # its prompt, alone
    s.start(_seq(engine, "long", prompt=100, reply=2))
    s.start(_seq(engine, "short", prompt=10, reply=2))
    engine.steps.clear()
    _drive(s, steps=8)
    for step in engine.steps:
        assert step[0] == ("gen", 1)  # the generating turn's token, every step, first
        assert sum(n for _, n in step) <= 16  # one step's budget
    assert engine.steps[0] == [("gen", 1), ("long", 15)]  # the prompts in arrival order: the first takes the room
    assert ("short", 10) not in engine.steps[0]


def test_prompts_per_step_bounds_the_prompt_chunks_of_a_step():
    engine = FakeEngine(max_sequences=3, step_tokens=64, prompts_per_step=1)
    s = Scheduler(engine)
    for name in "abc":
        s.start(_seq(engine, name, prompt=20, reply=2))
    _drive(s)
    assert all(sum(1 for name, n in step if n > 1) <= 1 for step in engine.steps)  # one prompt chunk a step
    assert engine.steps[0] == [("a", 20)]


def test_a_turn_alone_takes_whole_chunks_whatever_the_budget_left():
    engine = FakeEngine(max_sequences=2, step_tokens=16)
    s = Scheduler(engine)
    s.start(_seq(engine, "a", prompt=40, reply=1))
    _drive(s)
    assert [step[0][1] for step in engine.steps] == [16, 16, 8, 1]


def test_a_sessions_next_turn_waits_for_its_running_one_and_others_pass_it():
    engine = FakeEngine(max_sequences=4)
    s, planned = Scheduler(engine), []
    s.add(_job(engine, "s1-first", session="s1", reply=3, planned=planned))
    s.add(_job(engine, "s1-second", session="s1", planned=planned))
    s.add(Job(lambda job: "head read", "s1-read", None, session="s1"))  # a checkpoint: after s1's turns
    s.add(_job(engine, "other", session="s2", planned=planned))
    s.admit()
    assert planned == ["s1-first", "other"]  # room for all, but s1's second continues its first's state
    assert s.session_busy("s1") == "running" and s.holds("s1")
    ends = _drive(s)
    assert [name for name, _ in ends] == ["s1-first", "other", "s1-second", "s1-read"]
    assert ends[-1] == ("s1-read", "head read")  # answered without a turn
    assert s.session_busy("s1") is None


def test_a_job_cancelled_while_waiting_ends_at_admission_unplanned():
    engine = FakeEngine(max_sequences=1)
    s, planned = Scheduler(engine), []
    s.add(_job(engine, "a", planned=planned))
    gone = _job(engine, "b", planned=planned)
    s.add(gone)
    s.admit()
    gone.cancel.set()
    ends = _drive(s)
    assert planned == ["a"]
    assert ends[0][0] == "b" and isinstance(ends[0][1], Cancelled)


def test_a_turn_cancelled_in_its_prompt_leaves_before_its_next_chunk_and_is_released():
    engine = FakeEngine(max_sequences=2, step_tokens=8)
    s = Scheduler(engine)
    cut, other = _seq(engine, "cut", prompt=40), _seq(engine, "other", prompt=4, reply=2)
    s.start(cut)
    s.start(other)
    _drive(s, steps=1)
    cut.cancel.set()
    ends = _drive(s)
    assert ("cut", 8) in engine.steps[0] and not any(name == "cut" for step in engine.steps[1:] for name, _ in step)
    assert isinstance(dict(ends)["cut"], Cancelled) and cut.turn.live.released
    assert dict(ends)["other"] == "length"


def test_a_generating_turn_cancelled_ends_at_its_next_token_as_cancelled():
    engine = FakeEngine(max_sequences=2)
    s = Scheduler(engine)
    seq = _seq(engine, "a", prompt=2, reply=50)
    s.start(seq)
    _drive(s, steps=3)
    seq.cancel.set()
    assert _drive(s) == [("a", "cancelled")] and seq.turn.sampled < 50


def test_a_failed_step_fails_its_turns_and_the_scheduler_goes_on():
    engine = FakeEngine(max_sequences=2)
    s = Scheduler(engine)
    s.start(_seq(engine, "a"))
    s.start(_seq(engine, "b"))
    engine.fail_next = True
    ends = _drive(s, steps=1)
    assert sorted(name for name, _ in ends) == ["a", "b"] and all(isinstance(e, EngramError) for _, e in ends)
    assert not s.busy
    s.start(_seq(engine, "c"))
    assert _drive(s) == [("c", "length")]


def test_a_turn_whose_event_could_not_be_handled_is_dropped_before_its_next_step():
    engine = FakeEngine(max_sequences=2)
    s = Scheduler(engine)
    bad, good = _seq(engine, "bad", prompt=2, reply=10), _seq(engine, "good", prompt=2, reply=3)
    s.start(bad)
    s.start(good)
    ends = []
    for seq, event in s.step():
        if seq is bad:
            seq.error = ValueError("the handler failed")  # what the worker sets (worker.deliver)
        ends.append((seq.turn.name, event))
    ends += _drive(s)
    failed = [e for name, e in ends if name == "bad" and isinstance(e, Failed)]
    assert len(failed) == 1 and isinstance(failed[0].error, ValueError) and bad.turn.live.released
    assert ("good", "length") in ends


def test_shutdown_cancels_the_running_turns_and_hands_back_the_waiting_jobs():
    engine = FakeEngine(max_sequences=1)
    s = Scheduler(engine)
    s.add(_job(engine, "a", reply=100))
    waiting = _job(engine, "b")
    s.add(waiting)
    s.admit()
    _drive(s, steps=1)  # a generates
    assert s.shutdown() == [waiting] and waiting.cancelled and s.n_waiting == 0
    assert _drive(s) == [("a", "cancelled")]


def test_a_job_that_answers_without_a_turn_ends_at_admission():
    engine = FakeEngine()
    s = Scheduler(engine)
    s.add(Job(lambda job: {"restored": True}, "restore", None, turn=True, session="s"))
    ended, started = s.admit()
    assert started == 0 and len(ended) == 1 and isinstance(ended[0][1], Answered)
    assert ended[0][1].result == {"restored": True} and not s.busy
