"""Prefill and decode speed of the engine, as ratios to references measured in the same run:

- engramctl: a fresh state prefills N tokens of seeded filler through Engine.prefill (chunked as the
  daemon does), then Engine.generate samples M + 1 tokens greedily: M decode steps, each one sample,
  one incremental detokenization and one backend decode, what every streamed token costs. It runs on
  the daemon's worker thread (`on_worker`: daemon.worker.Worker.call), not on the thread that loaded the
  model, as in the daemon. What it leaves out is HTTP: `engramctl bench serve` measures that.
  decode_ms_per_token = Finish.decode_s / decode steps (the clock starts after the first token).
- raw llama.cpp (llama.cpp backend only): the same GGUF through llama-cpp-python's C API with the same
  n_ctx, n_batch, threads and flash attention (bench/llama_ref.py): prefill N, then M greedy decodes.
- transformers (a preset on llama.cpp only): the same preset in float32 on the transformers backend,
  prefilled once to N tokens; each run restores that state and decodes M tokens as above.

engramctl and raw llama.cpp alternate run by run, in alternating order (ABBA), after one warm-up run of
each that is not counted, so a neighbour's load on a shared machine hits both alike. Every figure is a
median with its [min-max] and process CPU/wall. measure() runs the phase with its references for run_bench.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from engramctl.bench.material import filler_ids
from engramctl.bench.timing import Clock, Series
from engramctl.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from engramctl.bench.config import BenchConfig, Progress
    from engramctl.bench.model import Loaded


def _generate(engine, live, decode_tokens: int) -> tuple[float, int, float]:
    """(wall seconds of the decode steps, decode steps, cpu/wall of the whole generation)."""
    gen = engine.generate(live, SamplingParams(temperature=0.0, max_tokens=decode_tokens + 1))
    with Clock() as c:
        for _ in gen:
            pass
    fin = gen.finish
    steps = max(0, len(fin.token_ids) - 1)  # every token but the last (pending) one was fed back
    return fin.decode_s, steps, c.sample.cpu_s / max(c.sample.wall_s, 1e-9)


class Side:
    """One contender's samples: prefill (wall + cpu) and decode (per-token wall, cpu/wall)."""

    def __init__(self) -> None:
        self.prefill = Series()
        self.decode_ms: list[float] = []
        self.decode_cpu: list[float] = []
        self.steps: list[int] = []

    def add_decode(self, wall_s: float, steps: int, cpu_per_wall: float) -> None:
        if steps:
            self.decode_ms.append(wall_s * 1000 / steps)
            self.decode_cpu.append(cpu_per_wall)
            self.steps.append(steps)

    def summary(self, prefill_tokens: int) -> dict[str, Any]:
        from engramctl.bench.timing import median, spread

        pre = self.prefill.median_ms()
        dec = median(self.decode_ms)
        return {
            "prefill_ms": pre,
            "prefill_spread_ms": self.prefill.spread_ms(),
            "prefill_cpu_per_wall": self.prefill.cpu_per_wall(),
            "prefill_tokens_per_s": None if not pre else round(prefill_tokens / (pre / 1000), 1),
            "decode_ms_per_token": None if dec is None else round(dec, 3),
            "decode_spread_ms": None if dec is None else [round(x, 3) for x in spread(self.decode_ms)],
            "decode_cpu_per_wall": None if dec is None else round(median(self.decode_cpu), 2),
            "decode_steps": min(self.steps) if self.steps else 0,
            "runs": len(self.prefill.samples),
        }


def on_host(logits) -> None:
    """Wait for the logits to be on the host: a CUDA forward returns before the GPU has run it, so a
    clock stopped at the return would time the launch, not the prefill (a host array needs nothing)."""
    if hasattr(logits, "cpu"):
        logits.cpu()


def engine_run(engine, ids: list[int], decode_tokens: int, side: Side | None) -> None:
    """One run on the engine: a fresh state prefills `ids` (the clock stops when its logits are on the
    host), then decodes `decode_tokens` greedily; its figures go to `side` (None: a warm-up)."""
    live = engine.new_live()
    try:
        with Clock() as c:
            on_host(engine.prefill(live, ids))
        wall, steps, cpw = _generate(engine, live, decode_tokens)
    finally:
        engine.release(live)
    if side is not None:
        side.prefill.add(c.sample)
        side.add_decode(wall, steps, cpw)


def _raw_run(raw, ids: list[int], decode_tokens: int, side: Side | None) -> None:
    chunks = raw.chunks(ids)
    with Clock() as c:
        first = raw.prefill(chunks)
    with Clock() as d:
        raw.decode_greedy(first, decode_tokens)
    if side is not None:
        side.prefill.add(c.sample)
        side.add_decode(d.sample.wall_s, decode_tokens, d.sample.cpu_s / max(d.sample.wall_s, 1e-9))


def run(
    engine,
    *,
    prefill_tokens: int,
    decode_tokens: int,
    runs: int,
    seed: int,
    raw=None,
    step: Callable[[str], None] = lambda _d: None,
    on_worker: Callable[[Callable[[], Any]], Any] = lambda fn: fn(),
) -> dict[str, Any]:
    """engramctl against raw llama.cpp (when `raw` is given). `step(description)` after every run.
    `on_worker(fn)` runs engramctl's side where the daemon would (the raw reference stays on this thread)."""
    ids = filler_ids(engine.tokenizer, prefill_tokens, seed + 2)
    mine, theirs = Side(), Side()
    for r in range(runs + 1):  # run 0 warms both up and is not counted
        count = r > 0
        order = ("engramctl", "raw") if r % 2 == 0 else ("raw", "engramctl")
        for who in order:
            if who == "engramctl":
                side = mine if count else None
                on_worker(lambda: engine_run(engine, ids, decode_tokens, side))
            elif raw is not None:
                _raw_run(raw, ids, decode_tokens, theirs if count else None)
        step("warm-up" if r == 0 else f"run {r}/{runs}")
    out: dict[str, Any] = {
        "prefill_tokens": prefill_tokens,
        "decode_tokens": decode_tokens,
        "engramctl": {
            "thread": "the daemon's worker thread (the model was loaded on another)",
            "backend": engine.info.backend,
            "weight_type": engine.info.weight_type or engine.info.dtype,
            **mine.summary(prefill_tokens),
        },
        "raw_llama_cpp": None,
        "transformers": None,
    }
    if raw is not None:
        out["raw_llama_cpp"] = {**theirs.summary(prefill_tokens), "settings": raw.settings()}
    return out


def transformers_decode(
    engine,
    *,
    prefill_tokens: int,
    decode_tokens: int,
    runs: int,
    seed: int,
    step: Callable[[str], None] = lambda _d: None,
) -> dict[str, Any]:
    """The comparison engine (transformers): one prefill of N tokens, then `runs` decodes of M tokens,
    each from that state restored (a prefill per run would cost minutes and measures nothing new)."""
    ids = filler_ids(engine.tokenizer, prefill_tokens, seed + 2)
    side = Side()
    live = engine.new_live()
    with Clock() as c:
        on_host(engine.prefill(live, ids))
    side.prefill.add(c.sample)
    state = engine.capture(live)
    engine.release(live)
    for r in range(runs + 1):  # run 0: warm-up of the single-token path, not counted
        live = engine.inject(state)
        wall, steps, cpw = _generate(engine, live, decode_tokens if r else 2)
        engine.release(live)
        if r:
            side.add_decode(wall, steps, cpw)
        step("transformers warm-up" if r == 0 else f"transformers run {r}/{runs}")
    return {
        "backend": engine.info.backend,
        "weight_type": engine.info.weight_type or engine.info.dtype,
        **side.summary(prefill_tokens),
        "prefill_runs": 1,
    }


def ratios(speed: dict[str, Any]) -> dict[str, float | None]:
    """engramctl / raw llama.cpp (1.0 = no overhead) and transformers / engramctl decode (the speed-up)."""

    def div(a, b):
        return None if not a or not b else round(a / b, 3)

    me, raw, tf = speed["engramctl"], speed.get("raw_llama_cpp") or {}, speed.get("transformers") or {}
    return {
        "decode_vs_raw_llama_cpp": div(me["decode_ms_per_token"], raw.get("decode_ms_per_token")),
        "prefill_vs_raw_llama_cpp": div(me["prefill_ms"], raw.get("prefill_ms")),
        "decode_speedup_vs_transformers": div(tf.get("decode_ms_per_token"), me["decode_ms_per_token"]),
    }


def speed_runs(runs: int) -> int:
    """Measured runs of the speed workload for --runs `runs` (7 for the default 3)."""
    return 2 * runs + 1


def measure(cfg: BenchConfig, settings, loaded: Loaded, progress: Progress) -> dict[str, Any]:
    """The speed workload with its references: raw llama.cpp on the same GGUF, and for a preset served by
    llama.cpp the same preset on transformers. Each reference is loaded for this phase only and freed after."""
    import gc

    engine = loaded.engine
    raw, raw_skipped = None, None
    compare = cfg.model is None and engine.info.backend == "llama.cpp"
    # Ratios of two ~5%-noisy figures against 1.05/1.10 bounds: more interleaved runs than the sweep's
    # (measured: 3 runs gave decode ratios 0.97-1.07 for the same F16 file on an idle machine).
    runs = speed_runs(cfg.runs)
    total = runs + 1 + (runs + 1 if compare else 0)
    progress.phase("speed", "prefill/decode speed", total)
    if engine.info.backend == "llama.cpp":
        from engramctl.bench.llama_ref import RawLlama
        from engramctl.errors import EngramError

        backend = engine.backend
        try:
            raw = RawLlama(loaded.gguf, n_ctx=backend.n_ctx, n_batch=backend.chunk_tokens, threads=loaded.threads)
        except EngramError as e:  # the figures without their reference are still worth having
            raw_skipped = f"the raw llama.cpp reference could not start: {e.message}"
            progress.note(f"Warning: {raw_skipped}")
    else:
        raw_skipped = "the raw llama.cpp reference runs on the llama.cpp backend only"
    from engramctl.daemon.worker import Worker

    # engramctl's side runs on the daemon's own worker thread, the model having been loaded on this one:
    # that is where the daemon decodes (an OpenMP llama.cpp build is ~1.8x slower there: docs/llama-threads.md)
    worker = Worker(max_queue=0)
    try:
        out = run(
            engine,
            prefill_tokens=cfg.prefill_tokens,
            decode_tokens=cfg.decode_tokens,
            runs=runs,
            seed=cfg.seed,
            raw=raw,
            step=lambda d: progress.advance("speed", d),
            on_worker=worker.call,
        )
    finally:
        worker.close()
        if raw is not None:
            raw.close()
    out["raw_skipped"] = raw_skipped
    out["transformers_skipped"] = None
    if compare:
        import dataclasses

        from engramctl.bench.model import load_model

        # threads None: torch keeps the thread count the llama.cpp engine left it (its threads stay llama.cpp's)
        ref_cfg = dataclasses.replace(cfg, backend="transformers", device="cpu", dtype="float32", threads=None)
        tf = load_model(ref_cfg, settings, progress.note).engine
        try:
            out["transformers"] = transformers_decode(
                tf,
                prefill_tokens=cfg.prefill_tokens,
                decode_tokens=cfg.decode_tokens,
                runs=runs,
                seed=cfg.seed,
                step=lambda d: progress.advance("speed", d),
            )
        finally:
            del tf
            gc.collect()
    elif engine.info.backend == "llama.cpp":
        out["transformers_skipped"] = (
            "runs for presets only; for a GGUF of your own, run the bench again with --backend transformers"
        )
    else:
        out["transformers_skipped"] = "the engine is the transformers backend"
    out["ratios"] = ratios(out)
    return out
