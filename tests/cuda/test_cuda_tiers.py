"""The store's VRAM tier with real CUDA tensors (tests/store/test_store_tiers.py covers it on the CPU with
a stand-in device): hardware detection and the default VRAM rule on a real GPU; placement, demotion to
RAM, eviction to disk, promotion back, byte-exact restores of engine-captured state into a model on the
GPU; and how long a restore takes from each tier (figures only, one run)."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from engramctl.settings import load_settings
from engramctl.state.codec import from_payload, to_payload
from engramctl.store import snapshot_file
from engramctl.store.records import payload_nbytes
from engramctl.store.store import Store
from engramctl.tiers.hardware import detect_hardware
from engramctl.tiers.plan import VRAM_RESERVE_FRACTION, VRAM_RESERVE_MIN, VRAM_SHARE, plan
from engramctl.tiers.planner import TierPlanner
from tests.cuda._common import load_backend, record, requires_cuda, token_ids
from tests.helpers import open_planned

pytestmark = requires_cuda

N_TOKENS, MORE = 40, 8
MiB = 2**20


@pytest.fixture
def open_store():
    """open_store(**settings flags) -> (a Store, the TierPlanner it follows, planned from this machine's real
    hardware or `hardware`)."""
    opened: list[Store] = []

    def _open(hardware=None, **flags) -> tuple[Store, TierPlanner]:
        store, tiers = open_planned(load_settings({"keep_last": 50, **flags}), hardware)
        opened.append(store)
        return store, tiers

    yield _open
    for s in opened:
        s.close()


def _devices(store: Store, sid: str) -> set[str]:
    hit = store._placement.get(sid, touch=False)
    return {t.device.type for t in hit[0][0].values()} if hit else set()


def _equal(tensors: dict, original: dict) -> bool:
    return tensors.keys() == original.keys() and all(torch.equal(tensors[k].cpu(), original[k]) for k in original)


def test_hardware_detection_and_the_vram_rule_see_the_gpu(tmp_path):
    hw = detect_hardware(tmp_path)
    free, total = torch.cuda.mem_get_info(0)
    assert hw.has_cuda and hw.vram_total_bytes == total and hw.gpu == torch.cuda.get_device_name(0)
    assert 0 < hw.vram_free_bytes <= total
    vram = plan(hw).tier("vram")
    reserve = max(VRAM_RESERVE_MIN, int(VRAM_RESERVE_FRACTION * total))
    assert vram.enabled and vram.device == "cuda" and "free VRAM" in vram.rule
    assert vram.budget_bytes == int(VRAM_SHARE * (hw.vram_free_bytes - reserve))
    with_model = plan(hw, model_bytes=4 * 2**30, model_on_cpu=False).tier("vram")
    assert with_model.budget_bytes == int(VRAM_SHARE * (hw.vram_free_bytes - 4 * 2**30 - reserve))
    record(
        "tiers",
        "gpu",
        {
            "name": hw.gpu,
            "vram_total_bytes": total,
            "vram_free_bytes": hw.vram_free_bytes,
            "vram_budget_bytes": vram.budget_bytes,
        },
    )


def test_vram_tier_holds_real_cuda_tensors_and_restores_exactly(open_store, zoo):
    backend = load_backend(zoo.path("granitemoehybrid"))
    lives, payloads = [], []
    for seed in range(3):
        live = backend.new_live()
        backend.prefill(live, token_ids(N_TOKENS, seed=10 + seed))
        payloads.append(to_payload(backend.capture(live), backend.spec, {"stage": "test"}))
        lives.append(live)
    originals = [{k: t.cpu().clone() for k, t in p[0].items()} for p in payloads]
    more = token_ids(MORE, seed=20)
    expected = backend.prefill(lives[0], more).cpu().clone()  # the conversation that never stopped
    size = payload_nbytes(payloads[0])
    assert all(payload_nbytes(p) == size for p in payloads)

    s, tiers = open_store(tier_ram_bytes=size)  # RAM: room for one
    assert tiers.plan.budget("vram") > 0 and tiers.plan.tier("vram").device == "cuda"  # the real default rule
    s._placement.set_budget("vram", size)  # VRAM: room for one
    a = s.snapshots.commit("a", payloads[0]).id
    s.flush()  # until written, a could not be moved out of the way
    assert s.snapshots.info(a).tiers == ("vram", "disk") and _devices(s, a) == {"cuda"}
    b = s.snapshots.commit("a", payloads[1]).id
    s.flush()
    assert s.snapshots.info(b).tiers == ("vram", "disk") and s.snapshots.info(a).tiers == ("ram", "disk")
    assert _devices(s, a) == {"cpu"} and _devices(s, b) == {"cuda"}  # demoted = copied off the GPU
    c = s.snapshots.commit("a", payloads[2]).id
    s.flush()
    assert (
        s.snapshots.info(c).tiers == ("vram", "disk")
        and s.snapshots.info(b).tiers == ("ram", "disk")
        and s.snapshots.info(a).tiers == ("disk",)
    )

    # restore a from disk: verified, promoted into VRAM; c goes down to RAM, b out to disk only
    tensors, meta = s.snapshots.load(a)
    assert {t.device.type for t in tensors.values()} == {"cuda"} and _equal(tensors, originals[0])
    assert (
        s.snapshots.info(a).tiers == ("vram", "disk")
        and s.snapshots.info(c).tiers == ("ram", "disk")
        and s.snapshots.info(b).tiers == ("disk",)
    )
    # restore c from RAM: promoted, a goes down
    assert (
        _equal(s.snapshots.load(c)[0], originals[2])
        and _devices(s, c) == {"cuda"}
        and s.snapshots.info(a).tiers == ("ram", "disk")
    )
    assert _equal(s.snapshots.load(b)[0], originals[1])
    for sid, original in zip((a, b, c), originals):  # what the writer thread wrote from VRAM/RAM copies
        assert _equal(snapshot_file.read(s._files.path(sid))[0], original)

    # the VRAM copy feeds a model on the GPU: inject, continue, compare; the tier's copy stays intact
    s.snapshots.load(a)
    assert s.snapshots.info(a).tiers[0] == "vram"
    tensors, meta = s.snapshots.load(a)
    live = backend.inject(from_payload(tensors, meta, backend.spec))
    got = backend.prefill(live, more).cpu()
    backend.decode(live, int(torch.argmax(got)))
    assert torch.equal(got, expected)
    assert _equal(s._placement.get(a, touch=False)[0][0], originals[0])  # inject copied, never aliased
    found = s.candidates.find(token_ids(N_TOKENS, seed=10) + more, backend.info.fingerprint)
    assert found and (found[0].id, found[0].n_tokens, found[0].tier) == (a, N_TOKENS, "vram")


def test_a_store_opened_before_the_gpu_was_seen_gets_its_vram_tier_on_replan(open_store, zoo, tmp_path):
    """The daemon opens its store before loading the model; if torch was not imported yet, the plan
    then has no VRAM. The replan after the load must add the tier, not only plan a budget for it."""
    import dataclasses

    blind = dataclasses.replace(detect_hardware(tmp_path), vram_total_bytes=None, vram_free_bytes=None, gpu=None)
    s, tiers = open_store(hardware=blind)
    assert tiers.plan.budget("vram") == 0 and [t.name for t in s._placement.tiers] == ["ram"]
    tiers.replan()  # real detection: this process has torch and a GPU
    assert [t.name for t in s._placement.tiers] == ["vram", "ram"] and s._placement.tiers[0].budget > 0
    backend = load_backend(zoo.path("granitemoehybrid"))
    live = backend.new_live()
    backend.prefill(live, token_ids(N_TOKENS, seed=30))
    sid = s.snapshots.commit("late", to_payload(backend.capture(live), backend.spec, {"stage": "test"})).id
    s.flush()
    assert s.snapshots.info(sid).tiers == ("vram", "disk") and _devices(s, sid) == {"cuda"}


def _median_ms(times: list[float]) -> float:
    return round(statistics.median(times) * 1000, 3)


def test_restore_time_by_tier_on_a_granite_350m_shaped_model(open_store, tmp_path):
    """Figures, not a benchmark: one run, medians of repeated restores of one snapshot of a random
    GraniteMoeHybrid shaped like granite-4.0-h-350m after 512 tokens. A restore = store.snapshots.load +
    from_payload (every check a restore makes) + engine inject into a fresh cache on the GPU."""
    from engramctl.bench.preset_dir import preset_dir
    from engramctl.engine.loading import load_engine

    model_dir = preset_dir("granite-4.0-h-350m", 0, tmp_path)
    engine = load_engine(str(model_dir), tmp_path, "cuda", "float32", backend="transformers")
    backend = engine.backend
    ids = token_ids(512, seed=7)
    live = backend.new_live()
    backend.prefill(live, ids[:64])  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    live = backend.new_live()
    backend.prefill(live, ids)
    torch.cuda.synchronize()
    prefill_s = time.perf_counter() - t0
    payload = to_payload(backend.capture(live), backend.spec, {"stage": "timing"})
    nbytes = payload_nbytes(payload)
    s = open_store(tier_ram_bytes=4 * nbytes)[0]
    sid = s.snapshots.commit("t", payload).id
    s.flush()
    reference = payload[0]["last_logits"].cpu()

    def restore() -> tuple[float, torch.Tensor]:
        torch.cuda.synchronize()
        t = time.perf_counter()
        tensors, meta = s.snapshots.load(sid)
        restored = backend.inject(from_payload(tensors, meta, backend.spec))
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t
        step = backend.decode(restored, 42).cpu()
        return elapsed, step

    times: dict[str, list[float]] = {}
    steps: dict[str, torch.Tensor] = {}
    for tier, reps in (("vram", 20), ("ram", 20), ("disk", 5)):
        if tier == "ram":
            s._placement.set_budget("vram", 0)  # demote it, and keep it from being promoted back
        if tier == "disk":
            s._placement.set_budget("ram", 0)  # only the (page-cached) file is left
        restore()  # warm-up
        assert s.snapshots.info(sid).tiers[0] == tier
        runs = [restore() for _ in range(reps)]
        times[tier] = [r[0] for r in runs]
        steps[tier] = runs[-1][1]
    assert torch.equal(steps["vram"], steps["ram"]) and torch.equal(steps["vram"], steps["disk"])
    assert torch.equal(s.snapshots.load(sid)[0]["last_logits"].cpu(), reference)
    ms = {tier: _median_ms(t) for tier, t in times.items()}
    record(
        "restore_time",
        "granite-4.0-h-350m-512tok-fp32",
        {
            "payload_mib": round(nbytes / MiB, 2),
            "median_ms": ms,
            "reps": {k: len(v) for k, v in times.items()},
            "ram_over_vram": round(ms["ram"] / ms["vram"], 2),
            "disk_over_vram": round(ms["disk"] / ms["vram"], 2),
            "reprefill_512_ms": round(prefill_s * 1000, 1),
        },
    )
    assert ms["vram"] < ms["disk"]
