"""The backends everything above the engine is tested on, and what legitimately differs between them.

A test (or a module, through `pytestmark`) marked `both_backends` runs once on transformers (the tiny
model directory, float32) and once on llama.cpp (the same weights converted to an f32 GGUF); the
`backend` fixture (tests/conftest.py) says which, `served_model(backend)` gives what `--model` names and
`tiny_engine(backend)` an in-process Engine on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

BACKENDS = ("transformers", "llama.cpp")
SERVED_FAMILY = "granitemoehybrid"

both_backends = pytest.mark.parametrize("backend", BACKENDS, indirect=True, scope="module")


def served_id(backend: str, model: Path) -> str:
    """The model id a daemon started with `--model <model>` reports: the resolved directory on
    transformers, the GGUF file's name on llama.cpp."""
    return model.name if backend == "llama.cpp" else str(Path(model).resolve())


def expected_build(backend: str) -> str:
    """ModelInfo.build on this machine: the llama.cpp that setup.sh built (CPU, its compiled SIMD), or torch on
    CPU with the served hybrid's recurrent layers on PyTorch's fallback (engine/hf_kernels.py)."""
    if backend == "llama.cpp":
        from engramctl.engine.llama_build import loaded_build
        from engramctl.engine.llama_lib import import_llama_cpp

        build = loaded_build(import_llama_cpp()).describe()
        assert build.startswith("CPU (") and "CUDA" not in build
        return build
    import torch

    fallback = "PyTorch fallback: not on CUDA (cpu); mamba-ssm not installed; causal-conv1d not installed"
    return f"torch {torch.__version__.split('+')[0]}, CPU; recurrent layers: {fallback}"


def weight_dtype(backend: str) -> str:
    """ModelInfo.dtype of the tiny served model: transformers runs it in float32; llama.cpp reports the
    GGUF's own weight type (the f32 conversion)."""
    return "F32" if backend == "llama.cpp" else "float32"
