"""A preset (presets.py) as a GGUF file for the llama.cpp backend: converted once, cached under the cache dir.

    path = preset_gguf("granite-4.0-h-350m", seed=0, outtype="f16", cache_dir=..., say=print)

The preset's cached model directory (preset_dir.py: float32 weights in Hugging Face layout) is converted by
llama.cpp's own converter (engine/gguf_export.py: f32/f16 from the converter, Q8_0 from llama.cpp's
quantizer). That takes ~1-2 minutes for the 350M preset on 2 cores, so the result is kept:
<cache dir>/bench-gguf/<preset>-s<seed>-<key>.<outtype>.gguf, with preset_dir.py's key (what decides the
weights and the file), so a changed preset or toolchain converts again instead of timing stale weights.

The presets' tokenizer is a byte-level BPE trained offline, whose pre-tokenizer hash the converter
cannot know: it is mapped to "gpt-2" (only how text is split depends on it; the model, its state and
its cost do not).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from engramctl.errors import UsageError

GGUF_TYPES = ("f16", "q8_0", "f32")
_PRETOKENIZER = "gpt-2"


def gguf_type(name: str) -> str:
    key = name.lower().replace("-", "_")
    if key not in GGUF_TYPES:
        raise UsageError(f"unknown GGUF weight type {name!r}; choose one of: {', '.join(GGUF_TYPES)}.")
    return key


def preset_gguf(
    preset: str, seed: int, outtype: str, cache_dir: Path, say: Callable[[str], None] = lambda _m: None
) -> Path:
    """The cached GGUF of `preset` at `seed` in `outtype`, converting it first when it is not there."""
    from engramctl.bench.preset_dir import preset_dir, preset_key
    from engramctl.bench.presets import preset_name

    preset, outtype = preset_name(preset), gguf_type(outtype)
    folder = Path(cache_dir) / "bench-gguf"
    final = folder / f"{preset}-s{seed}-{preset_key(preset, seed)}.{outtype}.gguf"
    if final.is_file():  # only os.replace creates it, so it is complete
        return final
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    say(
        f"converting preset {preset} (seed {seed}) to GGUF {outtype.upper()} with llama.cpp's converter; "
        f"one-time, cached as {final}"
    )
    with tempfile.TemporaryDirectory(prefix=".convert-", dir=folder) as tmp:
        model_dir = preset_dir(preset, seed, cache_dir, say)
        out = Path(tmp) / final.name
        from engramctl.engine.gguf_export import export_gguf

        export_gguf(model_dir, out, outtype, pretokenizer_fallback=_PRETOKENIZER)
        with out.open("rb") as fh:  # durable before visible
            os.fsync(fh.fileno())
        os.replace(out, final)
    return final
