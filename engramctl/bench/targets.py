"""The issues' targets, measured against the bench's figures: reported in the result, never asserted."""

from __future__ import annotations

from typing import Any


def efficiency(row: dict[str, Any], bw: dict[str, Any]) -> None:
    """efficiency = (bytes / floor bandwidth) / measured time: 1.0 = the restore ran at the floor."""
    if row["restore_disk_ms"]:
        ideal = row["snapshot_bytes"] / bw["disk_read_bytes_per_s"]
        row["restore_disk_efficiency"] = round(ideal / (row["restore_disk_ms"] / 1000), 4)
    if row["restore_ram_ms"]:
        ideal = row["state_bytes"] / bw["memcpy_bytes_per_s"]
        row["restore_ram_efficiency"] = round(ideal / (row["restore_ram_ms"] / 1000), 4)


TARGETS = {  # the issues' targets: (bound, "max" = measured must be <= bound | "min" = >= bound)
    "restore_speedup_at_1024": (100, "min"),
    "restore_disk_efficiency": (0.75, "min"),
    "token_reduction": (0.95, "min"),
    "decode_vs_raw_llama_cpp": (1.10, "max"),
    "prefill_vs_raw_llama_cpp": (1.05, "max"),
    "decode_speedup_vs_transformers": (4.0, "min"),
    "restore_ram_vs_memcpy_at_2048": (1.3, "max"),
}


def _target(name: str, measured: float, **extra: Any) -> dict[str, Any]:
    bound, kind = TARGETS[name]
    return {
        "target": bound,
        "measured": measured,
        **extra,
        "met": measured <= bound if kind == "max" else measured >= bound,
    }


def targets(
    rows: list[dict[str, Any]],
    mt: dict[str, Any] | None,
    sp: dict[str, Any] | None = None,
    bw: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The issues' targets, reported (never asserted)."""
    out: dict[str, Any] = {}
    at = next((r for r in rows if r["tokens"] == 1024), None)
    if at is not None and at["speedup_restore_ram"] is not None:
        out["restore_speedup_at_1024"] = _target("restore_speedup_at_1024", at["speedup_restore_ram"])
    effs = [r["restore_disk_efficiency"] for r in rows if r["restore_disk_efficiency"] is not None]
    if effs:
        best = max(effs)
        out["restore_disk_efficiency"] = _target(
            "restore_disk_efficiency", best, at_tokens=rows[effs.index(best)]["tokens"]
        )
    if mt is not None and mt.get("token_reduction") is not None:
        out["token_reduction"] = _target("token_reduction", mt["token_reduction"], turns=mt["turns"])
    for name, value in ((sp or {}).get("ratios") or {}).items():
        if value is not None:
            out[name] = _target(name, value)
    at = next((r for r in rows if r["tokens"] == 2048), None)
    if at is not None and at["restore_ram_ms"] and bw and bw.get("memcpy_bytes_per_s"):
        # restore time over what moving the state's bytes once at memcpy speed would take
        floor_ms = at["state_bytes"] / bw["memcpy_bytes_per_s"] * 1000
        out["restore_ram_vs_memcpy_at_2048"] = _target(
            "restore_ram_vs_memcpy_at_2048",
            round(at["restore_ram_ms"] / floor_ms, 3),
            floor_ms=round(floor_ms, 3),
            state_bytes=at["state_bytes"],
            # the same restore against one single-threaded memcpy of the state (bandwidth.one_memcpy_ms)
            one_memcpy_ms=bw.get("one_memcpy_at_2048_ms"),
            vs_one_memcpy=round(at["restore_ram_ms"] / bw["one_memcpy_at_2048_ms"], 3)
            if bw.get("one_memcpy_at_2048_ms")
            else None,
            # the same restore after another conversation used the engine (llama.cpp: one copy in)
            after_other_ms=at.get("restore_ram_after_other_ms"),
            after_other_vs_floor=round(at["restore_ram_after_other_ms"] / floor_ms, 3)
            if at.get("restore_ram_after_other_ms")
            else None,
        )
    return out
