"""The model a bench measures: --model, or a preset written once to a cached model directory or GGUF, loaded
by engine/loading.load_engine like the daemon's; and its description, the report's "model" object."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from engramctl.bench.config import BenchConfig


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
        # a preset defaults to float32 on the CPU (BENCHMARKS.md's figures), not to the settings' auto
        device = "cpu" if device == "auto" else device
        dtype = "float32" if dtype == "auto" else dtype
    engine = load_engine(
        ref, cache, device, dtype, backend=backend, progress=note, threads=cfg.threads, model_id=model_id
    )
    if engine.info.backend != "llama.cpp":
        return Loaded(engine, source, None, None)
    if gguf is None:
        gguf = resolve_gguf(ref, note)[0]  # local or already in the hub cache: load_engine just resolved it
    return Loaded(engine, source, gguf, cfg.threads or n_cpu_threads())


def describe_model(engine, cfg: BenchConfig, loaded: Loaded, load_s: float, resident: dict) -> dict[str, Any]:
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
