"""Tier budgets in bytes, planned from the hardware, each with the rule that produced it.

Default rules (the constants below):
- vram: only with CUDA. 50% of (free VRAM - model weights on the GPU - a working reserve of
  max(1 GiB, 10% of total VRAM)). The reserve is for activations and attention KV during prefill.
  Off where the serving backend keeps its states out of the store's VRAM tier (plan's vram_snapshots: llama.cpp,
  whose VRAM holds the layers tiers/offload.py places, its conversations' state, and device copies of parked
  conversations' states within a budget of its own: engine/llama_device_copies.py).
- ram:  50% of (available RAM - model weights when the model runs on the CPU).
- disk: the smaller of 20 GiB and 50% of (free disk on the data dir's filesystem + what the store
  already holds there, so a full store does not shrink its own budget at each start).
"Model weights" means weights the detected figures do not yet reflect: pass model_bytes when planning
before the model is loaded, 0 when planning after.

Overrides: Settings.tier_{vram,ram,disk}_bytes (defaults < config.toml < ENGRAM_TIER_*_BYTES <
flags, resolved by load_settings) replace the default rule; the rule text then says so and what the
default would have been. A vram override without CUDA is ignored (there is no VRAM to use).

N-gram memory tables (engramctl/ngram/table_spec.py) are claims on these budgets: `claim_tables` places each
table, in the order given (earliest N-gram layer first: its prefetch window is the shortest), in RAM if it
fits what is left of the RAM budget, else on disk if it fits what is left of the disk budget. A tier's
budget_bytes is then what is left for snapshots; table_bytes is what its tables take. `keep_tables` claims
them again, in the tiers they were given, on a new plan (TierPlanner.replan after loading the model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from engramctl.errors import NgramTableError
from engramctl.settings import Settings
from engramctl.tiers.hardware import Hardware
from engramctl.units import human_bytes

GiB = 2**30
VRAM_SHARE = 0.5
VRAM_RESERVE_MIN = 1 * GiB
VRAM_RESERVE_FRACTION = 0.10
RAM_SHARE = 0.5
DISK_SHARE = 0.5
DISK_CAP = 20 * GiB
TIER_NAMES = ("vram", "ram", "disk")  # hottest first


@dataclass(frozen=True)
class TierBudget:
    name: str
    budget_bytes: int
    detected_bytes: int | None  # the hardware figure the rule started from (free VRAM, available RAM, free disk)
    rule: str
    device: str | None  # "cuda" / "cpu" for memory tiers, None for disk
    table_bytes: int = 0  # taken by N-gram tables placed here; budget_bytes is what is left for snapshots

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0


@dataclass(frozen=True)
class TableClaim:
    """One N-gram table and the tier the planner placed it in."""

    name: str
    size_bytes: int
    tier: str  # "ram" or "disk"


@dataclass(frozen=True)
class TierPlan:
    hardware: Hardware
    tiers: tuple[TierBudget, ...]  # vram, ram, disk
    tables: tuple[TableClaim, ...] = ()

    def tier(self, name: str) -> TierBudget:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)

    def budget(self, name: str) -> int:
        return self.tier(name).budget_bytes


def _share(share: float, figure: int) -> int:
    return int(share * max(0, figure))


def vram_reserve(total_bytes: int) -> int:
    """VRAM kept free for activations, compute buffers and attention KV during prefill: max(1 GiB, 10% of total).
    The offload plan (tiers/offload.py) keeps the same reserve, so the layers and the tier agree."""
    return max(VRAM_RESERVE_MIN, int(VRAM_RESERVE_FRACTION * total_bytes))


def _vram(hw: Hardware, override: int | None, model_gpu: int, snapshots: bool) -> TierBudget:
    note = f" (override {human_bytes(override)} ignored)" if override is not None else ""
    if not hw.has_cuda:
        return TierBudget("vram", 0, None, "no CUDA device in this process: tier off" + note, "cuda")
    free, total = hw.vram_free_bytes or 0, hw.vram_total_bytes or 0
    if not snapshots:  # the llama.cpp backend's states are host arrays: VRAM holds its layers and conversations
        rule = (
            "the serving backend keeps no snapshot copies in VRAM: tier off (llama.cpp keeps device copies of "
            f"parked conversations instead: its VRAM copies line); free VRAM {human_bytes(free)}"
        )
        return TierBudget("vram", 0, free, rule + note, "cuda")
    reserve = vram_reserve(total)
    default = _share(VRAM_SHARE, free - model_gpu - reserve)
    rule = (
        f"{VRAM_SHARE:.0%} of (free VRAM {human_bytes(free)} - model {human_bytes(model_gpu)} - "
        f"reserve {human_bytes(reserve)} = max(1 GiB, {VRAM_RESERVE_FRACTION:.0%} of {human_bytes(total)}))"
    )
    return _resolve("vram", default, rule, override, free, "cuda")


def _ram(hw: Hardware, override: int | None, model_cpu: int) -> TierBudget:
    avail = hw.ram_available_bytes
    default = _share(RAM_SHARE, avail - model_cpu)
    rule = f"{RAM_SHARE:.0%} of (available RAM {human_bytes(avail)} - model on CPU {human_bytes(model_cpu)})"
    return _resolve("ram", default, rule, override, avail, "cpu")


def _disk(hw: Hardware, override: int | None, stored: int) -> TierBudget:
    usable = hw.disk_free_bytes + stored
    default = min(DISK_CAP, _share(DISK_SHARE, usable))
    rule = (
        f"min(cap {human_bytes(DISK_CAP)}, {DISK_SHARE:.0%} of (free disk {human_bytes(hw.disk_free_bytes)} "
        f"+ already stored {human_bytes(stored)}))"
    )
    return _resolve("disk", default, rule, override, hw.disk_free_bytes, None)


def _resolve(name: str, default: int, rule: str, override: int | None, detected: int, device: str | None) -> TierBudget:
    if override is None:
        return TierBudget(name, default, detected, rule, device)
    src = f"config.toml / ENGRAM_TIER_{name.upper()}_BYTES / --tier-{name}-bytes"
    text = f"set to {human_bytes(override)} by {src}; the default rule would give {human_bytes(default)}: {rule}"
    if override > detected:
        text += f" (warning: more than the {human_bytes(detected)} detected)"
    return TierBudget(name, override, detected, text, device)


def plan(
    hardware: Hardware,
    settings: Settings | None = None,
    model_bytes: int = 0,
    model_on_cpu: bool = True,
    stored_disk_bytes: int = 0,
    vram_snapshots: bool = True,
) -> TierPlan:
    """Budgets for vram, ram and disk (in that order) from the hardware and the overrides. `vram_snapshots`:
    whether the serving backend's states can be held in VRAM at all (False: the tier is off, and says why)."""
    get = (lambda f: getattr(settings, f)) if settings is not None else (lambda f: None)
    return TierPlan(
        hardware=hardware,
        tiers=(
            _vram(hardware, get("tier_vram_bytes"), 0 if model_on_cpu else model_bytes, vram_snapshots),
            _ram(hardware, get("tier_ram_bytes"), model_bytes if model_on_cpu else 0),
            _disk(hardware, get("tier_disk_bytes"), stored_disk_bytes),
        ),
    )


def claim_tables(tier_plan: TierPlan, tables: Sequence[tuple[str, int]], tier: str | None = None) -> TierPlan:
    """Place N-gram tables ((name, size_bytes), earliest layer first) in RAM, else on disk, within what is
    left of each budget; `tier` forces one of them. Raises NgramTableError when a table fits nowhere."""
    budgets = {t.name: t for t in tier_plan.tiers}
    left = {name: t.budget_bytes for name, t in budgets.items()}
    taken = {name: 0 for name in budgets}
    claims = list(tier_plan.tables)
    for name, size in tables:
        choices = (tier,) if tier is not None else ("ram", "disk")
        where = next((c for c in choices if left.get(c, 0) >= size), None)
        if where is None:
            room = ", ".join(f"{c} {human_bytes(left.get(c, 0))}" for c in choices)
            raise NgramTableError(
                f"the N-gram table {name} ({human_bytes(size)}) fits in no tier: what is left is {room}.",
                hint="raise the budget (ENGRAM_TIER_RAM_BYTES / ENGRAM_TIER_DISK_BYTES) or use a smaller table",
            )
        left[where] -= size
        taken[where] += size
        claims.append(TableClaim(name, int(size), where))
    return _with_tables(tier_plan, taken, tuple(claims))


def keep_tables(tier_plan: TierPlan, claims: Sequence[TableClaim]) -> TierPlan:
    """`tier_plan` (a new plan: TierPlanner.replan) with tables already placed claimed again in their tiers: a
    loaded table does not move. A budget the tables overrun leaves 0 for snapshots rather than failing."""
    taken = {t.name: 0 for t in tier_plan.tiers}
    for c in claims:
        taken[c.tier] = taken.get(c.tier, 0) + c.size_bytes
    return _with_tables(tier_plan, taken, tuple(tier_plan.tables) + tuple(claims))


def _with_tables(tier_plan: TierPlan, taken: Mapping[str, int], claims: tuple[TableClaim, ...]) -> TierPlan:
    new = tuple(
        t
        if not taken.get(t.name)
        else TierBudget(
            t.name,
            max(0, t.budget_bytes - taken[t.name]),
            t.detected_bytes,
            f"{t.rule}; minus N-gram tables {human_bytes(taken[t.name])}",
            t.device,
            t.table_bytes + taken[t.name],
        )
        for t in tier_plan.tiers
    )
    return TierPlan(tier_plan.hardware, new, claims)


def plan_json(tier_plan: TierPlan, usage: Mapping[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    """The plan as JSON; `usage` maps tier name -> (used bytes, snapshot count)."""
    hw = tier_plan.hardware
    usage = usage or {}
    return {
        "hardware": {
            "ram_total_bytes": hw.ram_total_bytes,
            "ram_available_bytes": hw.ram_available_bytes,
            "vram_total_bytes": hw.vram_total_bytes,
            "disk_free_bytes": hw.disk_free_bytes,
            "cpu": hw.cpu,
            "gpu": hw.gpu,
        },
        "tiers": [
            {
                "name": t.name,
                "budget_bytes": t.budget_bytes,
                "used_bytes": usage.get(t.name, (0, 0))[0],
                "snapshots": usage.get(t.name, (0, 0))[1],
                "rule": t.rule,
                "detected_bytes": t.detected_bytes,
                "table_bytes": t.table_bytes,
            }
            for t in tier_plan.tiers
        ],
        "tables": [{"name": c.name, "size_bytes": c.size_bytes, "tier": c.tier} for c in tier_plan.tables],
    }
