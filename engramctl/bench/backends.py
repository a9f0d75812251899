"""`engramctl bench backends`: one preset on the transformers backend and on the llama.cpp backend, on the same
device, so a user sees which to pick for that card.

    result = run_backends(BackendsConfig(preset="granite-4.0-h-350m", device="cuda"), settings, progress)

Both engines hold the same weights: the preset's cached model directory (transformers, in --dtype; a preset
defaults to float32) and the GGUF llama.cpp's converter makes from that directory (--gguf-type, as
`engramctl bench --gguf-type` and `bench serve --preset` do). The device is resolved once (auto: CUDA when
torch sees a GPU) and given to both; each row reports the device its engine really runs on, the build
(ModelInfo.build: torch and, on transformers, whether mamba-ssm / causal-conv1d or PyTorch's fallback runs
the recurrent layers; llama.cpp's CPU or CUDA build) and the weight type.

Each run is speed.py's engramctl run, on the daemon's worker thread: a fresh state prefills N tokens of seeded
filler (the clock stops when the last logits are on the host), then M greedy decode steps through
Engine.generate. The two engines alternate run by run in ABBA order after one uncounted warm-up each; medians
with [min-max]. No llama.cpp (not installed, or it cannot load the file): the transformers row alone, and why.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, replace
from typing import Any

from engramctl.bench.config import BenchConfig, Progress, engine_flags
from engramctl.errors import UsageError

SCHEMA = "engramctl-bench-backends/1"
BACKENDS = ("transformers", "llama.cpp")


@dataclass(frozen=True)
class BackendsConfig:
    preset: str = "tiny"
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda: resolved once, the same for both engines
    dtype: str = "auto"  # transformers' weights; a preset's auto is float32 (bench/model.py)
    gguf_type: str = "f16"  # llama.cpp's weights: f16 | q8_0 | f32
    prefill_tokens: int = 512
    decode_tokens: int = 64
    runs: int = 3
    threads: int | None = None
    command: str = "engramctl bench backends"

    def validate(self) -> None:
        if self.prefill_tokens < 1 or self.decode_tokens < 1 or self.runs < 1:
            raise UsageError("--prefill-tokens, --decode-tokens and --runs must each be at least 1.")


def _load(cfg: BackendsConfig, device: str, backend: str, settings, progress: Progress):
    from engramctl.bench.model import load_model

    bench_cfg = BenchConfig(
        preset=cfg.preset,
        seed=cfg.seed,
        backend=backend,
        gguf_type=cfg.gguf_type,
        device=device,
        dtype=cfg.dtype if backend == "transformers" else "auto",  # llama.cpp keeps the GGUF's type
        threads=cfg.threads,
    )
    return load_model(bench_cfg, settings, progress.note).engine


def _row(engine, side, prefill_tokens: int) -> dict[str, Any]:
    info = engine.info
    kernels = None
    if info.backend == "transformers":
        from engramctl.engine.hf_kernels import describe_model

        kernels = describe_model(engine.backend.model, info.device) or "no recurrent layers"
    return {
        "backend": info.backend,
        "device": info.device,
        "weight_type": info.weight_type or info.dtype,
        "build": info.build,
        "kernels": kernels,  # transformers: the recurrent layers' path; llama.cpp: None (its build says it)
        **side.summary(prefill_tokens),
    }


def _ratios(rows: list[dict[str, Any]]) -> dict[str, float | None] | None:
    """transformers / llama.cpp: how many times faster llama.cpp is (below 1: slower)."""
    by = {r["backend"]: r for r in rows}
    if set(by) != set(BACKENDS):
        return None

    def div(a, b):
        return None if not a or not b else round(a / b, 3)

    tf, ll = by["transformers"], by["llama.cpp"]
    return {
        "prefill_llama_cpp_speedup": div(tf["prefill_ms"], ll["prefill_ms"]),
        "decode_llama_cpp_speedup": div(tf["decode_ms_per_token"], ll["decode_ms_per_token"]),
    }


def run_backends(cfg: BackendsConfig, settings, progress: Progress | None = None) -> dict[str, Any]:
    from engramctl.bench.machine import describe_machine
    from engramctl.bench.material import filler_ids
    from engramctl.bench.timing import machine_load
    from engramctl.bench.workloads.speed import Side, engine_run
    from engramctl.daemon.worker import Worker
    from engramctl.engine.device import pick_device
    from engramctl.errors import BackendUnavailable, UnsupportedModel

    cfg.validate()
    progress = progress or Progress()
    started = time.time()
    device = pick_device(cfg.device)
    load_before = machine_load()
    if not load_before["idle"]:
        progress.note(
            f"Warning: other processes use {load_before['other_processes_cores']} cores; "
            "timings will be slower and noisier than on an idle machine"
        )
    engines, skipped = {}, {}
    tf_threads = 1
    for backend in BACKENDS:
        try:
            engines[backend] = _load(cfg, device, backend, settings, progress)
            if backend == "transformers":
                import torch

                tf_threads = torch.get_num_threads()
        # llama-cpp-python missing, or a CPU-only build asked for cuda: the transformers row is still worth having
        except (BackendUnavailable, UnsupportedModel, UsageError) as e:
            if backend == "transformers":
                raise
            skipped[backend] = e.message
            progress.note(f"Warning: no {backend} row: {e.message}")
    import torch

    # Loading llama.cpp on the CPU set torch's (process-wide) threads to 1, so that torch's OpenMP team does
    # not spin beside llama.cpp's (engine/loading.py); each run sets the count its own backend wants.
    torch_threads = {"transformers": cfg.threads or tf_threads, "llama.cpp": torch.get_num_threads()}

    def one_run(b: str, side) -> None:
        torch.set_num_threads(torch_threads[b])
        engine_run(engines[b], ids, cfg.decode_tokens, side)

    sides = {b: Side() for b in engines}
    ids = filler_ids(engines["transformers"].tokenizer, cfg.prefill_tokens, cfg.seed + 2)
    progress.phase("backends", "prefill/decode per backend", cfg.runs + 1)
    worker = Worker(max_queue=0)  # where the daemon runs a turn (the engines were loaded on this thread)
    try:
        for r in range(cfg.runs + 1):  # run 0 warms both up and is not counted
            order = list(engines) if r % 2 == 0 else list(reversed(engines))
            for b in order:
                side = sides[b] if r else None
                worker.call(lambda b=b, s=side: one_run(b, s))
            progress.advance("backends", "warm-up" if r == 0 else f"run {r}/{cfg.runs}")
        rows = [_row(engines[b], sides[b], cfg.prefill_tokens) for b in engines]
        for row in rows:
            row["torch_threads"] = torch_threads[row["backend"]]
    finally:
        torch.set_num_threads(tf_threads)
        worker.close()
        engines.clear()
        gc.collect()
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "command": cfg.command,
        "duration_s": round(time.time() - started, 1),
        "machine": {**describe_machine(device), "load_before": load_before, "load_after": machine_load(0.5)},
        "settings": {
            "preset": cfg.preset,
            "seed": cfg.seed,
            "device": device,
            "prefill_tokens": cfg.prefill_tokens,
            "decode_tokens": cfg.decode_tokens,
            "runs": cfg.runs,
            "warmup_runs": 1,
            "order": "ABBA",
            "sampling": "greedy",
        },
        "backends": rows,
        "skipped": skipped,
        "ratios": _ratios(rows),
    }


def with_command(cfg: BackendsConfig) -> BackendsConfig:
    """The exact command that reproduces this run, for the report."""
    import shlex

    parts = ["engramctl", "bench", "backends", "--preset", cfg.preset, "--gguf-type", cfg.gguf_type]
    parts += ["--prefill-tokens", str(cfg.prefill_tokens), "--decode-tokens", str(cfg.decode_tokens)]
    parts += ["--runs", str(cfg.runs), "--seed", str(cfg.seed), *engine_flags(cfg.threads, cfg.device, cfg.dtype)]
    return replace(cfg, command=shlex.join(parts))
