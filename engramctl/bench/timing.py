"""Timing primitives: wall + CPU time per measurement, median and spread over runs, and the idle check.

CPU time is the whole process's (every torch intra-op thread and the store's writer thread count),
so cpu/wall ~= the number of cores the measurement really had. On a shared machine a figure with
cpu/wall well below the thread count, or taken while other processes used CPU, is not trustworthy:
`machine_load()` measures the other processes' CPU use and `wait_idle()` waits for it to drop
(measured here: a busy neighbour made CPU figures 4-17x slower).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

IDLE_OTHER_CORES = 0.25  # other processes together below this many cores = idle


@dataclass(frozen=True)
class Sample:
    wall_s: float
    cpu_s: float

    def __add__(self, other: "Sample") -> "Sample":
        return Sample(self.wall_s + other.wall_s, self.cpu_s + other.cpu_s)


class Clock:
    """with Clock() as c: ...; then c.sample (wall and process CPU seconds of the block)."""

    def __enter__(self) -> "Clock":
        self._cpu0 = time.process_time()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        t1 = time.perf_counter()
        self.sample = Sample(t1 - self._t0, time.process_time() - self._cpu0)


def timed(fn: Callable[[], Any]) -> tuple[Any, Sample]:
    with Clock() as c:
        out = fn()
    return out, c.sample


@dataclass
class Series:
    """Samples of one measurement over runs."""

    samples: list[Sample] = field(default_factory=list)

    def add(self, s: Sample) -> None:
        self.samples.append(s)

    @property
    def walls(self) -> list[float]:
        return [s.wall_s for s in self.samples]

    def median_ms(self) -> float | None:
        return None if not self.samples else round(statistics.median(self.walls) * 1000, 3)

    def spread_ms(self) -> list[float] | None:
        """[min, max] in ms."""
        return None if not self.samples else [round(min(self.walls) * 1000, 3), round(max(self.walls) * 1000, 3)]

    def cpu_per_wall(self) -> float | None:
        wall = sum(self.walls)
        return None if wall <= 0 else round(sum(s.cpu_s for s in self.samples) / wall, 2)

    def summary(self) -> dict[str, Any]:
        return {
            "median_ms": self.median_ms(),
            "spread_ms": self.spread_ms(),
            "cpu_per_wall": self.cpu_per_wall(),
            "n": len(self.samples),
        }


def median(values: Iterable[float]) -> float | None:
    vals = list(values)
    return statistics.median(vals) if vals else None


def spread(values: Iterable[float]) -> list[float] | None:
    vals = list(values)
    return [min(vals), max(vals)] if vals else None


# -- the idle check ----------------------------------------------------------------------------------
def machine_load(sample_s: float = 1.0) -> dict[str, Any]:
    """Load average and how many cores other processes used over `sample_s` seconds."""
    import psutil

    me = os.getpid()
    procs = []
    for p in psutil.process_iter(["pid", "name"]):
        if p.info["pid"] == me:
            continue
        try:
            p.cpu_percent(None)
            procs.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    time.sleep(sample_s)
    busy = []
    for p in procs:
        try:
            busy.append((p.cpu_percent(None) / 100.0, p.info["pid"], p.info["name"] or "?"))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    busy.sort(reverse=True)
    others = round(sum(b[0] for b in busy), 2)
    try:
        loadavg = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        loadavg = None
    return {
        "loadavg": loadavg,
        "other_processes_cores": others,
        "busiest": [{"pid": pid, "name": name, "cores": round(c, 2)} for c, pid, name in busy[:3] if c >= 0.05],
        "idle": others < IDLE_OTHER_CORES,
    }


def busy_cpu_s() -> tuple[float, float]:
    """(CPU seconds this machine spent busy since boot, seconds the hypervisor gave its vCPUs to other VMs)."""
    import psutil

    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0), getattr(t, "steal", 0.0)


class LoadMeter:
    """with LoadMeter() as m: ...; then m.result: how many cores other processes used *while* the block
    ran (the machine's busy CPU time minus this process's, over the wall time). The before/after checks
    miss a neighbour who starts and stops in between; this does not. steal_cores: CPU the hypervisor
    gave to other VMs instead (a noisy host slows every figure alike, without any process here to see)."""

    def __enter__(self) -> "LoadMeter":
        self._t0, self._own0 = time.perf_counter(), time.process_time()
        self._busy0, self._steal0 = busy_cpu_s()
        return self

    def __exit__(self, *exc: Any) -> None:
        wall = max(time.perf_counter() - self._t0, 1e-9)
        busy, steal = busy_cpu_s()
        others = max(0.0, (busy - self._busy0) - (time.process_time() - self._own0)) / wall
        self.result = {
            "other_processes_cores": round(others, 2),
            "steal_cores": round((steal - self._steal0) / wall, 2),
            "wall_s": round(wall, 1),
            "idle": others < IDLE_OTHER_CORES,
        }


def wait_idle(timeout_s: float, on_wait: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Re-check every few seconds until other processes use < IDLE_OTHER_CORES, or `timeout_s` passes.
    Returns the last load measured (its "idle" says which)."""
    deadline = time.monotonic() + timeout_s
    load = machine_load()
    while not load["idle"] and time.monotonic() < deadline:
        if on_wait is not None:
            on_wait(load)
        time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
        load = machine_load()
    return load
