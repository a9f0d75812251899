"""A preset (presets.py) as a model directory in Hugging Face layout: built once, cached under the cache dir.

    model_dir = preset_dir("tiny", seed=0, cache_dir=..., say=print)
    engine = load_engine(str(model_dir), cache_dir, "cpu", "float32", backend="transformers")

So the bench loads a preset like any other model (engine/loading.load_engine), and gguf_presets.py converts
the same directory to GGUF. <cache dir>/bench-models/<preset>-s<seed>-<key>/ holds float32 weights, the
tokenizer and its chat template; the key hashes what decides the weights (the preset's config, the seed,
torch/transformers/llama-cpp-python versions, the format below), so a changed preset builds again instead of
timing stale weights. The 350M preset takes ~1.4 GB there.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

_FORMAT = "1"  # bump when what is written changes


def preset_key(preset: str, seed: int) -> str:
    """What decides a preset's weights and files, hashed (also gguf_presets.py's cache key)."""
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import transformers

    from engramctl.bench.presets import CHATML_TEMPLATE, granite_kwargs

    try:
        llama = version("llama_cpp_python")
    except PackageNotFoundError:
        llama = "?"
    parts = [
        _FORMAT,
        preset,
        str(seed),
        json.dumps(granite_kwargs(preset), sort_keys=True),
        CHATML_TEMPLATE,
        torch.__version__,
        transformers.__version__,
        llama,
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:10]


def preset_dir(preset: str, seed: int, cache_dir: Path, say: Callable[[str], None] = lambda _m: None) -> Path:
    """The cached model directory of `preset` at `seed`, building it first when it is not there."""
    from engramctl.bench.presets import preset_name
    from engramctl.engine.loading import build_once

    preset = preset_name(preset)
    final = Path(cache_dir) / "bench-models" / f"{preset}-s{seed}-{preset_key(preset, seed)}"

    def build(tmp: Path) -> None:
        say(f"building preset {preset} (seed {seed}); one-time, cached as {final}")
        _save(preset, seed, tmp)

    return build_once(final, build)


def _save(preset: str, seed: int, out: Path) -> None:
    from transformers.utils import logging as hf_logging

    from engramctl.bench.presets import build_model, build_tokenizer

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # save_pretrained's "Writing model shards" bar
    try:
        model = build_model(preset, seed=seed)
        model.save_pretrained(out)
        del model
        build_tokenizer().save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
