from __future__ import annotations

import json

from engramctl.settings import load_settings
from engramctl.tiers.hardware import Hardware
from engramctl.tiers.plan import DISK_CAP, GiB, plan, plan_json


def hw(**kw) -> Hardware:
    base = dict(
        ram_total_bytes=32 * GiB,
        ram_available_bytes=20 * GiB,
        disk_total_bytes=500 * GiB,
        disk_free_bytes=100 * GiB,
        cpu="Test CPU",
        cpu_cores=8,
        cpu_threads=16,
    )
    return Hardware(**{**base, **kw})


def test_default_rules_cpu_only():
    p = plan(hw(), None, model_bytes=2 * GiB, model_on_cpu=True)
    assert [t.name for t in p.tiers] == ["vram", "ram", "disk"]
    assert p.budget("vram") == 0 and "no CUDA" in p.tier("vram").rule
    assert p.budget("ram") == 9 * GiB  # 50% of (20 - 2)
    assert p.budget("disk") == DISK_CAP  # min(20 GiB, 50% of 100 GiB)
    assert p.tier("ram").detected_bytes == 20 * GiB


def test_default_rules_with_cuda_and_model_on_gpu():
    h = hw(vram_total_bytes=24 * GiB, vram_free_bytes=22 * GiB, gpu="Test GPU", disk_free_bytes=10 * GiB)
    p = plan(h, None, model_bytes=4 * GiB, model_on_cpu=False, stored_disk_bytes=2 * GiB)
    reserve = max(GiB, int(0.1 * 24 * GiB))
    assert p.budget("vram") == int(0.5 * (22 * GiB - 4 * GiB - reserve))
    assert p.budget("ram") == 10 * GiB  # weights are on the GPU: nothing subtracted
    assert p.budget("disk") == 6 * GiB  # 50% of (10 free + 2 already ours)
    tiny = plan(
        hw(vram_total_bytes=2 * GiB, vram_free_bytes=GiB, gpu="small"), None, model_bytes=GiB, model_on_cpu=False
    )
    assert tiny.budget("vram") == 0  # never negative


def test_overrides_env_and_flags(engram_home, monkeypatch):
    (engram_home / "config").mkdir(parents=True)
    (engram_home / "config" / "config.toml").write_text('tier_ram_bytes = "1GiB"\ntier_disk_bytes = "5GB"\n')
    monkeypatch.setenv("ENGRAM_TIER_DISK_BYTES", "512MB")
    s = load_settings({"tier_vram_bytes": "3GiB"})
    p = plan(hw(vram_total_bytes=24 * GiB, vram_free_bytes=22 * GiB, gpu="g"), s)
    assert p.budget("ram") == GiB  # config.toml
    assert p.budget("disk") == 512 * 10**6  # env beats config
    assert p.budget("vram") == 3 * GiB  # flag
    assert "ENGRAM_TIER_RAM_BYTES" in p.tier("ram").rule and "default rule would give" in p.tier("ram").rule
    p_cpu = plan(hw(), s)
    assert p_cpu.budget("vram") == 0 and "ignored" in p_cpu.tier("vram").rule


def test_plan_json_shape():
    p = plan(hw(), None)
    j = plan_json(p, {"ram": (123, 2), "disk": (456, 3)})
    json.dumps(j)
    assert set(j) == {"hardware", "tiers", "tables"} and j["tables"] == []  # N-gram tables claimed: none here
    assert set(j["hardware"]) == {
        "ram_total_bytes",
        "ram_available_bytes",
        "vram_total_bytes",
        "disk_free_bytes",
        "cpu",
        "gpu",
    }
    assert j["hardware"]["vram_total_bytes"] is None and j["hardware"]["gpu"] is None
    ram = next(t for t in j["tiers"] if t["name"] == "ram")
    assert {"name", "budget_bytes", "used_bytes", "snapshots", "rule"} <= set(ram)
    assert (ram["used_bytes"], ram["snapshots"]) == (123, 2)


def test_vram_tier_off_where_the_backend_keeps_no_snapshots_in_vram(engram_home, monkeypatch):
    """llama.cpp's states are host arrays: the tier is off with CUDA present, and says so (the VRAM figure stays)."""
    from engramctl.tiers.planner import TierPlanner

    h = hw(vram_total_bytes=24 * GiB, vram_free_bytes=20 * GiB, gpu="Test GPU")
    monkeypatch.setenv("ENGRAM_TIER_VRAM_BYTES", "2GiB")
    p = plan(h, load_settings(), vram_snapshots=False)
    vram = p.tier("vram")
    assert vram.budget_bytes == 0 and vram.detected_bytes == 20 * GiB
    assert vram.rule.startswith("the serving backend keeps no snapshot copies in VRAM: tier off")
    assert "(override 2.0 GiB ignored)" in vram.rule
    assert plan(h, load_settings()).budget("vram") == 2 * GiB  # a backend that can: the override holds

    class Holder:
        plans: list = []

        def follow(self, new):
            self.plans.append(new)

        def stored_bytes(self):
            return 0

        def usage(self):
            return {}

    planner = TierPlanner.start(load_settings(), Holder(), hardware=h, vram_snapshots=False)
    assert planner.plan.budget("vram") == 0
    assert planner.replan(hardware=h).budget("vram") == 0  # kept across replans that do not say
    assert planner.replan(hardware=h, vram_snapshots=True).budget("vram") == 2 * GiB
