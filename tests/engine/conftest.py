"""Fixtures the engine's loading tests share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def hf_home(tmp_path, monkeypatch) -> Path:
    """An empty, offline Hugging Face cache of this test's own (the hub is never reached)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf"
