"""Which default model (engine/models.py default_model_ref) a GPU gets: the hybrid's GGUF on llama.cpp when
llama.cpp was built with GPU support, its safetensors on transformers when llama.cpp is CPU-only. The hub and
the GPU are stand-ins: what is under test is the choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from engramctl.engine import gguf_source, loading, models


@pytest.fixture
def cuda_wanted(monkeypatch):
    resolved: list[str] = []
    monkeypatch.setattr(models, "llama_cpp_installed", lambda: True)
    monkeypatch.setattr(models, "_wants_cuda", lambda device: True)
    monkeypatch.setattr(gguf_source, "resolve_gguf", lambda ref, say: (resolved.append(ref), (Path("m.gguf"), ref))[1])
    monkeypatch.setattr(loading, "resolve_model", lambda ref, cache: resolved.append(ref))
    return resolved


def test_a_gpu_build_of_llama_cpp_gets_the_gguf(cuda_wanted, monkeypatch, tmp_path):
    monkeypatch.setattr(models, "llama_cpp_on_gpu", lambda: True)
    ref = models.default_model_ref(tmp_path, device="auto")
    assert ref == models.DEFAULT_HYBRID_GGUFS[0] and loading.choose_backend(ref) == "llama.cpp"
    assert cuda_wanted == [models.DEFAULT_HYBRID_GGUFS[0]]


def test_a_cpu_build_of_llama_cpp_leaves_the_gpu_to_transformers(cuda_wanted, monkeypatch, tmp_path):
    monkeypatch.setattr(models, "llama_cpp_on_gpu", lambda: False)
    ref = models.default_model_ref(tmp_path, device="cuda")
    assert ref == models.DEFAULT_HYBRID and loading.choose_backend(ref) == "transformers"
    assert cuda_wanted == [models.DEFAULT_HYBRID]  # no GGUF was looked up


def test_this_machines_llama_cpp_build_is_read_from_the_library():
    from engramctl.engine.llama_lib import import_llama_cpp

    assert models.llama_cpp_on_gpu() == bool(import_llama_cpp().llama_supports_gpu_offload())
