from __future__ import annotations

import pytest

from tests.helpers import clear_store_env


@pytest.fixture(autouse=True)
def engram_home(tmp_path, monkeypatch):
    home = tmp_path / "engram"
    monkeypatch.setenv("ENGRAM_HOME", str(home))
    clear_store_env(monkeypatch)
    return home
