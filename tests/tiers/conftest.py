from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def engram_home(tmp_path, monkeypatch):
    home = tmp_path / "engram"
    monkeypatch.setenv("ENGRAM_HOME", str(home))
    for var in ("ENGRAM_TIER_VRAM_BYTES", "ENGRAM_TIER_RAM_BYTES", "ENGRAM_TIER_DISK_BYTES"):
        monkeypatch.delenv(var, raising=False)
    return home
