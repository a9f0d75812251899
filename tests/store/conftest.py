from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from payloads import make_payload as _make_payload  # noqa: E402

from engramctl.settings import load_settings  # noqa: E402
from engramctl.store.store import Store  # noqa: E402
from engramctl.tiers.hardware import Hardware  # noqa: E402
from engramctl.tiers.planner import TierPlanner  # noqa: E402
from tests.helpers import open_planned as open_planned_store  # noqa: E402

MiB = 2**20


@pytest.fixture
def make_payload():
    return _make_payload


def fake_hardware(**kw) -> Hardware:
    base = dict(
        ram_total_bytes=16 * 2**30,
        ram_available_bytes=8 * 2**30,
        disk_total_bytes=100 * 2**30,
        disk_free_bytes=50 * 2**30,
        cpu="Test CPU",
        cpu_cores=4,
        cpu_threads=8,
    )
    base.update(kw)
    return Hardware(**base)


@pytest.fixture
def hardware_like():
    """hardware_like(**figures) -> Hardware with made-up figures (a stand-in GPU, say)."""
    return fake_hardware


class Clock:
    """An injectable clock that only moves when told to."""

    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def open_planned(engram_home, clock):
    """open_planned(ram=..., disk=..., keep_last=..., ttl=..., hardware=...) -> (Store, the TierPlanner it
    follows, planned on `hardware` or stand-in figures), the store closed at teardown."""
    opened: list[Store] = []

    def _open(
        ram: int | str | None = 64 * MiB,
        disk: int | str | None = 256 * MiB,
        keep_last: int = 8,
        ttl: float | None = None,
        **kw,
    ) -> tuple[Store, TierPlanner]:
        flags = {"tier_ram_bytes": ram, "tier_disk_bytes": disk, "keep_last": keep_last, "session_ttl_s": ttl}
        hardware = kw.pop("hardware", None) or fake_hardware()
        store, tiers = open_planned_store(load_settings(flags), hardware, clock=kw.pop("clock", clock), **kw)
        opened.append(store)
        return store, tiers

    yield _open
    for s in opened:
        s.close()


@pytest.fixture
def open_store(open_planned):
    """open_store(ram=..., disk=..., keep_last=..., ttl=...) -> Store (open_planned's), closed at teardown."""
    return lambda *a, **kw: open_planned(*a, **kw)[0]


@pytest.fixture
def store(open_store):
    return open_store()
