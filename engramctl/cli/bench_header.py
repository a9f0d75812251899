"""The head of `engramctl bench`'s text report: where it ran (machine, software, the load other processes
put on it), what it ran (model, backend, weights, tier budgets) and how (runs, seed, sampling), as fields
drawn by output.py. The workloads' tables follow it (bench_report.py).
"""

from __future__ import annotations

from typing import Any

from engramctl.cli.output import render_fields
from engramctl.units import human_bytes


def header(r: dict[str, Any]) -> str:
    m, mo, s = r["machine"], r["model"], r["settings"]
    gpu = f"{m['gpu']} ({human_bytes(m['vram_total_bytes'])})" if m.get("gpu") else "none"
    lb, la = m["load_before"], m["load_after"]

    def load(x: dict) -> str:
        state = "idle" if x["idle"] else "BUSY"
        avg = "-" if not x.get("loadavg") else f"{x['loadavg'][0]:.2f}"
        return f"{state} (other processes {x['other_processes_cores']:.2f} cores, loadavg {avg})"

    layers = ", ".join(f"{n} {k}" for k, n in mo["layers"].items())
    tiers = ", ".join(
        f"{name} {'off' if not t['budget_bytes'] else human_bytes(t['budget_bytes'])}" for name, t in r["tiers"].items()
    )
    return render_fields(
        [
            ("bench", f"{r['mode']}, {r['created']}, {r['duration_s']:.0f} s"),
            ("command", r["command"]),
            (
                "cpu",
                f"{m['cpu']}, {m['cpu_cores']} cores / {m['cpu_threads']} threads, torch threads {m['torch_threads']}",
            ),
            ("ram", f"{human_bytes(m['ram_total_bytes'])} total, {human_bytes(m['ram_available_bytes'])} available"),
            ("gpu", gpu),
            (
                "software",
                f"{m['os']}, python {m['python']}, torch {m['torch']}, transformers {m['transformers']}"
                + (f", llama-cpp-python {m['llama_cpp_python']}" if m.get("llama_cpp_python") else ""),
            ),
            ("load", f"before: {load(lb)}; after: {load(la)}"),
            ("during", during_text(m.get("load_during") or {})),
            ("model", f"{mo['id']} ({mo['family']}, {mo['n_params'] / 1e6:.1f} M params, {layers} layers)"),
            ("backend", backend_text(mo)),
            ("weights", weights_text(mo)),
            ("tiers", tiers),
            (
                "method",
                f"{s['runs']} runs + 1 warm-up (not counted), seed {s['seed']}, {s['sampling']}; "
                "times: median [min-max]; cpu/wall = process CPU time / wall time",
            ),
        ]
    )


def during_text(during: dict[str, dict]) -> str:
    """Other processes' CPU while each phase ran: a BUSY phase's figures are slower and noisier."""
    if not during:
        return "-"
    parts = []
    for phase, x in during.items():
        steal = x.get("steal_cores") or 0.0
        note = ("" if x["idle"] else " (BUSY)") + (f" + {steal:.2f} stolen by the host" if steal >= 0.05 else "")
        parts.append(f"{phase} {x['other_processes_cores']:.2f} cores{note}")
    return "other processes used " + ", ".join(parts)


def backend_text(mo: dict[str, Any]) -> str:
    backend = mo.get("backend") or "transformers"
    if backend == "llama.cpp":
        return f"llama.cpp on {mo['device']}, {mo.get('threads')} threads; GGUF {mo.get('gguf')}"
    return f"{backend} on {mo['device']}"


def weights_text(mo: dict[str, Any]) -> str:
    kind = mo.get("weight_type") or mo["dtype"]
    resident = mo.get("resident_weight_bytes")
    shown = "unknown" if resident is None else human_bytes(resident)
    return f"{kind}, {human_bytes(mo['weights_bytes'])}; resident {shown} ({mo.get('resident_weight_how', '')})"
