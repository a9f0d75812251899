"""A preset (presets.py) as a GGUF file for the llama.cpp backend: converted once, cached under the cache dir.

    path = preset_gguf("granite-4.0-h-350m", seed=0, outtype="f16", cache_dir=..., say=print)

The preset's float32 weights are saved in Hugging Face layout in a temporary directory and converted by
llama.cpp's own converter (engine/gguf_export.py: f32/f16 from the converter, Q8_0 from llama.cpp's
quantizer). That takes ~1-2 minutes for the 350M preset on 2 cores, so the result is kept:
<cache dir>/bench-gguf/<preset>-s<seed>-<key>.<outtype>.gguf. The key hashes what decides the weights
and the file (the preset's config, the seed, torch/transformers/llama-cpp-python versions, this
module's format), so a changed preset or toolchain converts again instead of timing stale weights.

The presets' tokenizer is a byte-level BPE trained offline, whose pre-tokenizer hash the converter
cannot know: it is mapped to "gpt-2" (only how text is split depends on it; the model, its state and
its cost do not).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from engramctl.errors import UsageError

GGUF_TYPES = ("f16", "q8_0", "f32")
_FORMAT = "1"  # bump when what is written changes
_PRETOKENIZER = "gpt-2"


def gguf_type(name: str) -> str:
    key = name.lower().replace("-", "_")
    if key not in GGUF_TYPES:
        raise UsageError(f"unknown GGUF weight type {name!r}; choose one of: {', '.join(GGUF_TYPES)}.")
    return key


def _key(preset: str, seed: int) -> str:
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import transformers

    from engramctl.bench.presets import CHATML_TEMPLATE, _granite_kwargs

    try:
        llama = version("llama_cpp_python")
    except PackageNotFoundError:
        llama = "?"
    parts = [
        _FORMAT,
        preset,
        str(seed),
        json.dumps(_granite_kwargs(preset), sort_keys=True),
        CHATML_TEMPLATE,
        torch.__version__,
        transformers.__version__,
        llama,
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:10]


def preset_gguf(
    preset: str, seed: int, outtype: str, cache_dir: Path, say: Callable[[str], None] = lambda _m: None
) -> Path:
    """The cached GGUF of `preset` at `seed` in `outtype`, converting it first when it is not there."""
    from engramctl.bench.presets import preset_name

    preset, outtype = preset_name(preset), gguf_type(outtype)
    folder = Path(cache_dir) / "bench-gguf"
    final = folder / f"{preset}-s{seed}-{_key(preset, seed)}.{outtype}.gguf"
    if final.is_file():  # only os.replace creates it, so it is complete
        return final
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    say(
        f"converting preset {preset} (seed {seed}) to GGUF {outtype.upper()} with llama.cpp's converter; "
        f"one-time, cached as {final}"
    )
    with tempfile.TemporaryDirectory(prefix=".convert-", dir=folder) as tmp:
        model_dir = _save_preset(preset, seed, Path(tmp) / "hf")
        out = Path(tmp) / final.name
        from engramctl.engine.gguf_export import export_gguf

        export_gguf(model_dir, out, outtype, pretokenizer_fallback=_PRETOKENIZER)
        with out.open("rb") as fh:  # durable before visible
            os.fsync(fh.fileno())
        os.replace(out, final)
    return final


def _save_preset(preset: str, seed: int, out: Path) -> Path:
    from transformers.utils import logging as hf_logging

    from engramctl.bench.presets import build_model, build_tokenizer

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # save_pretrained's "Writing model shards" bar
    try:
        model = build_model(preset, seed=seed, dtype="float32")
        model.save_pretrained(out)
        del model
        build_tokenizer().save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return out
