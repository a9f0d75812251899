"""`engramctl tiers` renders the llama.cpp offload plan (/v1/tiers "offload", tiers/offload.py) as a few lines and
carries it in --json; a stand-in daemon listing gives the plan, so only the rendering is under test here (the plan
itself: tests/tiers/test_offload.py; a real daemon's: tests/engine/test_llama_offload.py)."""

from __future__ import annotations

import copy

import pytest

from engramctl.tiers.offload import Gpu, LayerCost, ModelCost, plan_offload

GiB, MiB = 2**30, 2**20
MODEL = ModelCost(tuple(LayerCost(121 * MiB, 32 * MiB) for _ in range(32)), 70 * MiB, 70 * MiB)


def _tiers(offload: dict | None, copies: dict | None = None) -> dict:
    return {
        "hardware": {
            "ram_total_bytes": 64 * GiB,
            "ram_available_bytes": 50 * GiB,
            "vram_total_bytes": 6 * GiB,
            "disk_free_bytes": 500 * GiB,
            "cpu": "AMD Ryzen 9 7950X",
            "gpu": "NVIDIA GeForce GTX 1660",
        },
        "tiers": [
            {"name": "vram", "budget_bytes": 0, "used_bytes": 0, "snapshots": 0, "rule": "off", "table_bytes": 0},
            {"name": "ram", "budget_bytes": GiB, "used_bytes": 0, "snapshots": 0, "rule": "r", "table_bytes": 0},
            {"name": "disk", "budget_bytes": GiB, "used_bytes": 0, "snapshots": 0, "rule": "d", "table_bytes": 0},
        ],
        "tables": [],
        "model": {"model": "m.gguf", "backend": "llama.cpp", "weight_type": "Q4_K_M", "device": "cuda"},
        "serving": {"at_once": 4, "running": 0, "waiting": 0, "sessions": [], "why": "x"},
        "prefix_states": {"count": 0, "used_bytes": 0, "budget_bytes": GiB},
        "offload": offload,
        "device_copies": copies,
    }


class _Listing:
    def __init__(self, plan: dict):
        self.plan = plan

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def tiers(self) -> dict:
        return copy.deepcopy(self.plan)


@pytest.fixture
def stand_in(monkeypatch):
    def use(offload: dict | None, copies: dict | None = None) -> None:
        monkeypatch.setattr("engramctl.cli.listing.open_listing", lambda st, out: _Listing(_tiers(offload, copies)))

    return use


def test_a_split_model_says_what_went_where_and_why(cli, stand_in):
    plan = plan_offload(
        MODEL, Gpu("NVIDIA GeForce GTX 1660", int(5.6 * GiB), 6 * GiB), sequences=4, sequences_rule="4 at once: y"
    )
    stand_in(plan.to_json())
    lines = cli("tiers").stdout.splitlines()
    offload = next(ln for ln in lines if ln.startswith("OFFLOAD "))
    assert "30/33 layers on the GPU (NVIDIA GeForce GTX 1660)" in offload
    assert "GPU: weights 3.5 GiB, state 960.0 MiB" in offload  # 30 x 121 MiB, 30 x 32 MiB
    assert "CPU: weights 382.0 MiB, state 64.0 MiB" in offload  # 2 blocks + output + embedding, 2 blocks' state
    rule = next(ln for ln in lines if ln.startswith("OFFLOAD RULE "))
    assert rule.split(None, 2)[2] == plan.rule
    assert next(ln for ln in lines if ln.startswith("AT ONCE ")).split(None, 2)[2] == "4 at once: y"
    assert cli.json("tiers")["offload"] == plan.to_json()


def test_a_cpu_build_says_why_no_layer_is_on_the_gpu(cli, stand_in):
    plan = plan_offload(MODEL, None, gpu_build=False)
    stand_in(plan.to_json())
    lines = cli("tiers").stdout.splitlines()
    offload = next(ln for ln in lines if ln.startswith("OFFLOAD "))
    assert "0/33 layers on the GPU; CPU: weights" in offload and "GPU:" not in offload
    assert "no GPU support (a CPU build)" in next(ln for ln in lines if ln.startswith("OFFLOAD RULE "))


def test_no_offload_plan_no_offload_lines(cli, stand_in):
    """transformers (or no daemon): the whole model on one device, nothing to say per layer."""
    stand_in(None)
    out = cli("tiers").stdout
    assert "OFFLOAD" not in out and "MODEL " in out
    assert cli.json("tiers")["offload"] is None


def test_the_vram_copies_say_how_many_are_held_of_what_budget_and_why(cli, stand_in):
    """llama.cpp's VRAM tier (/v1/tiers "device_copies", engine/llama_device_copies.py)."""
    plan = plan_offload(MODEL, Gpu("NVIDIA GeForce RTX 4090", 20 * GiB, 24 * GiB), sequences=4)
    copies = {"slots": 64, "budget_bytes": 5 * GiB, "used_bytes": 300 * MiB, "held": 12, "restores": 40, "rule": "r"}
    stand_in(plan.to_json(), copies)
    lines = cli("tiers").stdout.splitlines()
    line = next(ln for ln in lines if ln.startswith("VRAM COPIES "))
    assert "12 of 64 parked conversations, 300.0 MiB of 5.0 GiB; 40 resumed from a copy" in line
    assert next(ln for ln in lines if ln.startswith("VRAM RULE ")).split(None, 2)[2] == "r"
    assert cli.json("tiers")["device_copies"] == copies
    stand_in(plan_offload(MODEL, None, gpu_build=False).to_json(), {"slots": 0, "rule": "off: no layer is on a GPU"})
    lines = cli("tiers").stdout.splitlines()
    assert next(ln for ln in lines if ln.startswith("VRAM COPIES ")).endswith("off: no layer is on a GPU")
