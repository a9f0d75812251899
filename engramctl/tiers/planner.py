"""The tier plan in force, and how it changes: what the daemon owns (daemon/context.py, `Daemon.tiers`).

plan.py's rules turn the hardware into byte budgets; the planner keeps the current TierPlan, plans again
when the model has loaded (`replan`: the weights now show in the detected figures), places the loaded
model's N-gram tables on the budgets (`claim_tables`; `replan` keeps them where they are) and describes it
all (`plan_json`: `/v1/tiers`, `engramctl tiers`). It decides; the holder of the bytes keeps within what it
decided: the snapshot store's Retention (store/retention.py) is told each new plan through `follow`.

    store = Store.open(settings)
    tiers = TierPlanner.start(settings, store.retention)     # the store keeps within the first plan at once

The daemon builds it (daemon/app.py, daemon/context.py); so do the bench (bench/runner.py) and a listing
that reads the store without a daemon (cli/listing.py). The store never builds one.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, Sequence

from engramctl.settings import Settings
from engramctl.tiers.hardware import Hardware, detect_hardware
from engramctl.tiers.plan import TableClaim, TierPlan, claim_tables, keep_tables, plan, plan_json


class BudgetHolder(Protocol):
    """What holds bytes in the tiers (the store): it keeps within the plan it is given."""

    def follow(self, plan: TierPlan) -> None: ...

    def stored_bytes(self) -> int: ...  # on disk already: the disk rule counts them as usable

    def usage(self) -> dict[str, tuple[int, int]]: ...  # tier name -> (bytes used, snapshot count)


class TierPlanner:
    def __init__(self, settings: Settings, holder: BudgetHolder):
        self.settings = settings
        self._holder = holder
        self._claims: tuple[TableClaim, ...] = ()  # the N-gram tables claim_tables placed (immutable)
        self._lock = threading.RLock()
        self._vram_snapshots = True  # whether the serving backend's states can be held in VRAM (plan.plan)
        self.plan: TierPlan | None = None

    @classmethod
    def start(
        cls,
        settings: Settings,
        holder: BudgetHolder,
        model_bytes: int = 0,
        model_on_cpu: bool = True,
        hardware: Hardware | None = None,
        vram_snapshots: bool = True,
    ) -> "TierPlanner":
        """A planner whose first plan (replan's arguments) the holder already follows: a lowered disk
        budget applies before the first write."""
        planner = cls(settings, holder)
        planner.replan(model_bytes, model_on_cpu, hardware, vram_snapshots)
        return planner

    def replan(
        self,
        model_bytes: int = 0,
        model_on_cpu: bool = True,
        hardware: Hardware | None = None,
        vram_snapshots: bool | None = None,
    ) -> TierPlan:
        """Plan the budgets from the hardware (detected now unless given) and make the holder follow them;
        shrinking tiers evict at once. Pass model_bytes when the detected figures do not show the weights yet,
        and the hardware the engine measured when its VRAM figure is not torch's (llama.cpp: ggml's);
        vram_snapshots (kept from the last call when None): whether the engine's states can be held in VRAM."""
        hw = hardware or detect_hardware(self.settings.paths.data_dir)
        with self._lock:
            if vram_snapshots is not None:
                self._vram_snapshots = vram_snapshots
            new = plan(
                hw,
                self.settings,
                model_bytes,
                model_on_cpu,
                stored_disk_bytes=self._holder.stored_bytes(),
                vram_snapshots=self._vram_snapshots,
            )
            if self._claims:  # a loaded N-gram table does not move: claimed again where it is
                new = keep_tables(new, self._claims)
            self._apply(new)
        return new

    def claim_tables(self, tables: Sequence[tuple[str, int]], tier: str | None = None) -> dict[str, str]:
        """Place the loaded model's N-gram tables ((name, size_bytes), earliest layer first) on the tier
        budgets (plan.claim_tables; `tier` forces one) and keep them there across replan().
        Returns name -> "ram" | "disk"; NgramTableError when one fits nowhere."""
        with self._lock:
            new = claim_tables(self._current(), tables, tier)
            self._claims = new.tables
            self._apply(new)
        return {c.name: c.tier for c in new.tables}

    def plan_json(self) -> dict[str, Any]:
        return plan_json(self._current(), self._holder.usage())

    def _current(self) -> TierPlan:
        if self.plan is None:
            raise RuntimeError("no tier plan yet: replan() first")
        return self.plan

    def _apply(self, new: TierPlan) -> None:
        self._holder.follow(new)
        self.plan = new
