"""Runs the workloads in order and assembles the one JSON object the report prints.

    result = run_bench(BenchConfig(...), progress)

Everything runs in this process on the same engine and store code the daemon uses ("mode":
"in-process"). The store lives in a fresh directory under the settings' data dir (so ENGRAM_HOME and
the config file are honoured, the disk measured is the data dir's disk, and the user's own snapshots
are never touched); it is deleted at the end unless keep_data is set.
"""

from __future__ import annotations

import dataclasses
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from engramctl.bench.memory import resident_weight_bytes
from engramctl.bench.timing import LoadMeter, machine_load, wait_idle
from engramctl.errors import UsageError

SCHEMA = "engramctl-bench/1"
MiB = 1 << 20


@dataclass(frozen=True)
class BenchConfig:
    contexts: tuple[int, ...] = (256, 1024, 4096)
    turns: int = 20
    runs: int = 3
    reply_tokens: int = 16
    message_tokens: int = 32
    seed: int = 0
    quick: bool = False
    model: str | None = None  # --model reference (directory, .gguf, hub id); None = preset
    preset: str | None = None
    backend: str = "auto"  # auto | transformers | llama.cpp; a preset on llama.cpp runs as a converted GGUF
    gguf_type: str = "f16"  # a preset's GGUF weight type on llama.cpp: f16 | q8_0 | f32
    prefill_tokens: int = 512  # speed workload: prefill N, then decode M tokens; 0 skips it
    decode_tokens: int = 64
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    memcpy_bytes: int = 256 * MiB
    disk_bytes: int = 256 * MiB
    wait_idle_s: float = 0.0
    keep_data: bool = False
    command: str = "engramctl bench"

    def validate(self) -> None:
        if not self.contexts and self.turns == 0 and self.prefill_tokens == 0:
            raise UsageError("nothing to run: give --contexts, --turns and/or --prefill-tokens.")
        if any(c < 1 for c in self.contexts):
            raise UsageError("every context length must be at least 1 token.")
        if self.runs < 1:
            raise UsageError("--runs must be at least 1.")
        if self.turns < 0 or self.reply_tokens < 1:
            raise UsageError("--turns must be >= 0 and --reply-tokens >= 1.")
        if self.prefill_tokens < 0 or self.decode_tokens < 1:
            raise UsageError("--prefill-tokens must be >= 0 and --decode-tokens >= 1.")


class Progress:
    """What the runner tells its caller; the CLI draws rich progress bars on stderr from it."""

    def phase(self, key: str, description: str, total: int) -> None: ...

    def advance(self, key: str, description: str | None = None) -> None: ...

    def note(self, text: str) -> None: ...


class StoreBox:
    """The bench's Store, which the disk-restore measurement closes and reopens (a fresh process's view)."""

    def __init__(self, settings) -> None:
        from engramctl.store.files import SnapshotFiles
        from engramctl.store.store import Store

        self._open = lambda: Store.open(settings)
        self._files = SnapshotFiles(settings.paths.data_dir)
        self.store = self._open()

    def reopen(self):
        self.store.close()
        self.store = self._open()
        return self.store

    def snapshot_path(self, sid: str) -> Path:
        return self._files.path(sid)

    def close(self) -> None:
        self.store.close()


def _machine(engine_device: str) -> dict[str, Any]:
    import torch
    import transformers

    from engramctl.tiers.hardware import detect_hardware

    hw = detect_hardware(Path.home())
    return {
        "cpu": hw.cpu,
        "cpu_cores": hw.cpu_cores,
        "cpu_threads": hw.cpu_threads,
        "ram_total_bytes": hw.ram_total_bytes,
        "ram_available_bytes": hw.ram_available_bytes,
        "gpu": hw.gpu,
        "vram_total_bytes": hw.vram_total_bytes,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "llama_cpp_python": _llama_version(),
        "device": engine_device,
    }


def _llama_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama_cpp_python")
    except PackageNotFoundError:
        return None


def _model(engine, cfg: BenchConfig, loaded: Loaded, load_s: float, resident: dict) -> dict[str, Any]:
    info, spec, source = engine.info, engine.spec, loaded.source
    kinds = [layer.kind for layer in spec.layers]
    return {
        "id": info.model_id,
        "source": source,
        "preset": cfg.preset if source == "preset" else None,
        "family": info.family,
        "architecture": info.architecture,
        "n_params": info.n_params,
        "backend": info.backend,
        "weight_type": info.weight_type or info.dtype,
        "weights_bytes": info.weights_bytes,
        "resident_weight_bytes": resident["bytes"],
        "resident_weight_how": resident["how"],
        "gguf": None if loaded.gguf is None else str(loaded.gguf),
        "threads": loaded.threads,
        "dtype": info.dtype,
        "device": info.device,
        "context_length": info.context_length,
        "layers": {k: kinds.count(k) for k in sorted(set(kinds))},
        "fingerprint": info.fingerprint,
        "chat_template": engine.tokenizer.has_chat_template,
        "prefix_stable": engine.prefix_stable,
        "load_s": round(load_s, 3),
    }


@dataclass(frozen=True)
class Loaded:
    engine: Any
    source: str  # "preset" | "model"
    gguf: Path | None  # the file llama.cpp serves (None on transformers)
    threads: int | None  # llama.cpp's threads (None on transformers: torch_threads says)


def load_model(cfg: BenchConfig, settings, note: Callable[[str], None]) -> Loaded:
    """--model, or the preset written once to a cached model directory (transformers) or GGUF (llama.cpp),
    through the daemon's loader."""
    from engramctl.engine.gguf_source import resolve_gguf
    from engramctl.engine.llama_lib import n_cpu_threads
    from engramctl.engine.loading import load_engine

    cache, device, dtype, backend, model_id = settings.paths.cache_dir, cfg.device, cfg.dtype, cfg.backend, None
    gguf = None
    if cfg.model is not None:
        ref, source = cfg.model, "model"
    elif backend == "llama.cpp":
        from engramctl.bench.gguf_presets import preset_gguf

        gguf = preset_gguf(cfg.preset or "tiny", cfg.seed, cfg.gguf_type, cache, note)
        ref, source = str(gguf), "preset"
    else:
        from engramctl.bench.preset_dir import preset_dir
        from engramctl.bench.presets import preset_id

        ref, source, backend = str(preset_dir(cfg.preset or "tiny", cfg.seed, cache, note)), "preset", "transformers"
        model_id = preset_id(cfg.preset or "tiny", cfg.seed)
        device = "cpu" if device == "auto" else device  # a preset's timings compare across machines on the CPU
        dtype = "float32" if dtype == "auto" else dtype
    engine = load_engine(
        ref, cache, device, dtype, backend=backend, progress=note, threads=cfg.threads, model_id=model_id
    )
    if engine.info.backend != "llama.cpp":
        return Loaded(engine, source, None, None)
    if gguf is None:
        gguf = resolve_gguf(ref, note)[0]  # local or already in the hub cache: load_engine just resolved it
    return Loaded(engine, source, gguf, cfg.threads or n_cpu_threads())


def _warm_up(engine) -> None:
    """Not counted: first calls allocate, load kernels and fill caches."""
    from engramctl.bench.material import filler_ids
    from engramctl.engine.sampling import SamplingParams

    live = engine.new_live()
    engine.prefill(live, filler_ids(engine.tokenizer, 64, 99))
    live2 = engine.inject(engine.capture(live))
    for _ in engine.generate(live2, SamplingParams(temperature=0.0, max_tokens=4)):
        pass
    engine.release(live)
    engine.release(live2)


def run_bench(cfg: BenchConfig, settings, progress: Progress | None = None) -> dict[str, Any]:
    import torch

    from engramctl.bench.workloads import bandwidth, contexts, multiturn, save

    cfg.validate()
    progress = progress or Progress()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    load_before = machine_load()
    if cfg.wait_idle_s > 0 and not load_before["idle"]:
        progress.note(
            f"waiting up to {cfg.wait_idle_s:.0f} s for the machine to be idle "
            f"(other processes use {load_before['other_processes_cores']} cores)"
        )
        load_before = wait_idle(cfg.wait_idle_s)
    if not load_before["idle"]:
        progress.note(
            f"Warning: other processes use {load_before['other_processes_cores']} cores; "
            "timings will be slower and noisier than on an idle machine"
        )
    started = time.time()
    progress.phase("load", "loading model", 1)
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    loaded = load_model(cfg, settings, progress.note)
    engine = loaded.engine
    load_s = time.perf_counter() - t0
    progress.advance("load")
    limit = engine.info.context_length
    if cfg.contexts and limit is not None and max(cfg.contexts) + cfg.message_tokens + 1 > limit:
        raise UsageError(
            f"context {max(cfg.contexts)} + a {cfg.message_tokens}-token message does not fit the "
            f"model's context of {limit} tokens.",
            hint="pass smaller --contexts",
        )
    multiturn_skip = None
    if cfg.turns and not engine.tokenizer.has_chat_template:
        multiturn_skip = "the model has no chat template"

    data_root = settings.paths.data_dir
    data_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    bench_dir = Path(tempfile.mkdtemp(prefix="bench-", dir=data_root))
    bench_settings = dataclasses.replace(settings, paths=dataclasses.replace(settings.paths, data_dir=bench_dir))
    box = StoreBox(bench_settings)
    during: dict[str, dict] = {}  # phase -> cores other processes used while it ran
    try:
        _warm_up(engine)
        resident = resident_weight_bytes(engine, loaded.gguf)  # after the warm-up touched every weight
        plan = box.store.tiers.plan_json()
        progress.phase("bandwidth", "bandwidth floor", 2)
        with LoadMeter() as m:  # the restore targets divide by this floor: a disturbed one shows here
            bw = bandwidth.measure(
                bench_dir, cfg.memcpy_bytes, cfg.disk_bytes, cfg.runs, step=lambda: progress.advance("bandwidth")
            )
        during["bandwidth"] = m.result
        sp = None
        if cfg.prefill_tokens:
            with LoadMeter() as m:
                sp = _speed(cfg, settings, loaded, progress)
            during["speed"] = m.result
        rows: list[dict[str, Any]] = []
        if cfg.contexts:
            progress.phase("contexts", "context sweep", 1 + cfg.runs * len(cfg.contexts))
            with LoadMeter() as m:
                rows = contexts.run(
                    engine,
                    box,
                    list(cfg.contexts),
                    cfg.runs,
                    cfg.seed,
                    cfg.message_tokens,
                    step=lambda d: progress.advance("contexts", d),
                )
            during["contexts"] = m.result
            for row in rows:
                _efficiency(row, bw)
            at = next((r for r in rows if r["tokens"] == 2048), None)
            if at is not None:
                bw["one_memcpy_at_2048_ms"] = round(bandwidth.one_memcpy_ms(at["state_bytes"], cfg.runs), 3)
        mt: dict[str, Any] | None = None
        save_summary: dict[str, Any] = {"snapshots": 0}
        if cfg.turns and multiturn_skip is None:
            progress.phase("multiturn", "multi-turn chat", cfg.turns)
            with LoadMeter() as m:
                raw = multiturn.run(
                    engine, box, cfg.turns, cfg.reply_tokens, step=lambda d: progress.advance("multiturn", d)
                )
            during["multiturn"] = m.result
            mt = multiturn.summarize(raw, cfg.turns, cfg.reply_tokens)
            save_summary = save.summarize(raw["rows"])
    finally:
        box.close()
        if not cfg.keep_data:
            shutil.rmtree(bench_dir, ignore_errors=True)
    load_after = machine_load(0.5)
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "command": cfg.command,
        "mode": "in-process",
        "duration_s": round(time.time() - started, 1),
        "machine": {
            **_machine(engine.info.device),
            "load_before": load_before,
            "load_after": load_after,
            "load_during": during,
        },
        "model": _model(engine, cfg, loaded, load_s, resident),
        "settings": {
            "contexts": list(cfg.contexts),
            "turns": cfg.turns,
            "runs": cfg.runs,
            "warmup_runs": 1,
            "reply_tokens": cfg.reply_tokens,
            "message_tokens": cfg.message_tokens,
            "seed": cfg.seed,
            "quick": cfg.quick,
            "sampling": "greedy",
            "data_dir": str(bench_dir),
            "data_kept": cfg.keep_data,
            "backend": cfg.backend,
            "gguf_type": cfg.gguf_type if loaded.gguf else None,
            "prefill_tokens": cfg.prefill_tokens,
            "decode_tokens": cfg.decode_tokens,
        },
        "tiers": {t["name"]: {"budget_bytes": t["budget_bytes"], "rule": t["rule"]} for t in plan["tiers"]},
        "bandwidth": bw,
        "contexts": rows,
        "multiturn": mt
        if mt is not None
        else {
            "turns": 0,
            "prompt_tokens_sent": 0,
            "prompt_tokens_computed": {"stateful": 0, "stateless": 0},
            "token_reduction": None,
            "skipped": multiturn_skip or "--turns 0",
        },
        "save": save_summary,
        "speed": sp,
        "targets": targets(rows, mt, sp, bw),
    }


def speed_runs(runs: int) -> int:
    """Measured runs of the speed workload for --runs `runs` (7 for the default 3)."""
    return 2 * runs + 1


def _speed(cfg: BenchConfig, settings, loaded: Loaded, progress: Progress) -> dict[str, Any]:
    """The speed workload with its references: raw llama.cpp on the same GGUF, and for a preset served by
    llama.cpp the same preset on transformers. Each reference is loaded for this phase only and freed after."""
    import gc

    from engramctl.bench.workloads import speed

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
        out = speed.run(
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

        # threads None: torch keeps the thread count the llama.cpp engine left it (its threads stay llama.cpp's)
        ref_cfg = dataclasses.replace(cfg, backend="transformers", device="cpu", dtype="float32", threads=None)
        tf = load_model(ref_cfg, settings, progress.note).engine
        try:
            out["transformers"] = speed.transformers_decode(
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
    out["ratios"] = speed.ratios(out)
    return out


def _efficiency(row: dict[str, Any], bw: dict[str, Any]) -> None:
    """efficiency = (bytes / floor bandwidth) / measured time: 1.0 = the restore ran at the floor."""
    if row["restore_disk_ms"]:
        ideal = row["snapshot_bytes"] / bw["disk_read_bytes_per_s"]
        row["restore_disk_efficiency"] = round(ideal / (row["restore_disk_ms"] / 1000), 4)
    if row["restore_ram_ms"]:
        ideal = row["state_bytes"] / bw["memcpy_bytes_per_s"]
        row["restore_ram_efficiency"] = round(ideal / (row["restore_ram_ms"] / 1000), 4)


TARGETS = {  # the issues' targets: (bound, "max" = measured must be <= bound | "min" = >= bound)
    "restore_speedup_at_1024": (100, "min"),
    "restore_disk_efficiency": (0.75, "min"),
    "token_reduction": (0.95, "min"),
    "decode_vs_raw_llama_cpp": (1.10, "max"),
    "prefill_vs_raw_llama_cpp": (1.05, "max"),
    "decode_speedup_vs_transformers": (4.0, "min"),
    "restore_ram_vs_memcpy_at_2048": (1.3, "max"),
}


def _target(name: str, measured: float, **extra: Any) -> dict[str, Any]:
    bound, kind = TARGETS[name]
    return {
        "target": bound,
        "measured": measured,
        **extra,
        "met": measured <= bound if kind == "max" else measured >= bound,
    }


def targets(
    rows: list[dict[str, Any]],
    mt: dict[str, Any] | None,
    sp: dict[str, Any] | None = None,
    bw: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The issues' targets, reported (never asserted)."""
    out: dict[str, Any] = {}
    at = next((r for r in rows if r["tokens"] == 1024), None)
    if at is not None and at["speedup_restore_ram"] is not None:
        out["restore_speedup_at_1024"] = _target("restore_speedup_at_1024", at["speedup_restore_ram"])
    effs = [r["restore_disk_efficiency"] for r in rows if r["restore_disk_efficiency"] is not None]
    if effs:
        best = max(effs)
        out["restore_disk_efficiency"] = _target(
            "restore_disk_efficiency", best, at_tokens=rows[effs.index(best)]["tokens"]
        )
    if mt is not None and mt.get("token_reduction") is not None:
        out["token_reduction"] = _target("token_reduction", mt["token_reduction"], turns=mt["turns"])
    for name, value in ((sp or {}).get("ratios") or {}).items():
        if value is not None:
            out[name] = _target(name, value)
    at = next((r for r in rows if r["tokens"] == 2048), None)
    if at is not None and at["restore_ram_ms"] and bw and bw.get("memcpy_bytes_per_s"):
        # restore time over what moving the state's bytes once at memcpy speed would take
        floor_ms = at["state_bytes"] / bw["memcpy_bytes_per_s"] * 1000
        out["restore_ram_vs_memcpy_at_2048"] = _target(
            "restore_ram_vs_memcpy_at_2048",
            round(at["restore_ram_ms"] / floor_ms, 3),
            floor_ms=round(floor_ms, 3),
            state_bytes=at["state_bytes"],
            # the same restore against one single-threaded memcpy of the state (bandwidth.one_memcpy_ms)
            one_memcpy_ms=bw.get("one_memcpy_at_2048_ms"),
            vs_one_memcpy=round(at["restore_ram_ms"] / bw["one_memcpy_at_2048_ms"], 3)
            if bw.get("one_memcpy_at_2048_ms")
            else None,
            # the same restore after another conversation used the engine (llama.cpp: one copy in)
            after_other_ms=at.get("restore_ram_after_other_ms"),
            after_other_vs_floor=round(at["restore_ram_after_other_ms"] / floor_ms, 3)
            if at.get("restore_ram_after_other_ms")
            else None,
        )
    return out
