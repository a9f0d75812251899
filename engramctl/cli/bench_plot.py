"""`engramctl bench --plot`: the result drawn into a PNG (matplotlib, an optional extra, imported here only)."""

from __future__ import annotations

from typing import Any

from engramctl.errors import UsageError

PLOT_HINT = "pip install 'engramctl[plot]'   (or: pip install matplotlib)"


def require_matplotlib() -> None:
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib, which is not installed.", hint=PLOT_HINT) from None
    del matplotlib


def plot(r: dict[str, Any], path: str) -> None:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    rows = r["contexts"]
    if rows:
        xs = [c["tokens"] for c in rows]
        for key, label, style in (
            ("prefill_ms", "re-prefill", "o-"),
            ("restore_ram_ms", "restore (RAM)", "s-"),
            ("restore_disk_ms", "restore (disk, cold)", "^-"),
            ("ttft_prefill_ms", "TTFT re-prefill", "o:"),
            ("ttft_restored_ms", "TTFT restored (RAM)", "s:"),
        ):
            ax1.plot(xs, [c[key] for c in rows], style, label=label)
        ax1.set_xscale("log", base=2)
        ax1.set_yscale("log")
        ax1.set_xlabel("context (tokens)")
        ax1.set_ylabel("time (ms, median)")
        ax1.set_title("restore vs re-prefill")
        ax1.grid(True, which="both", alpha=0.3)
        ax1.legend(fontsize=8)
    else:
        ax1.set_axis_off()
    mt = r["multiturn"]
    if mt.get("per_turn"):
        turns = [p["turn"] for p in mt["per_turn"]]
        ax2.plot(turns, [p["computed_stateless"] for p in mt["per_turn"]], "o-", label="stateless (whole history)")
        ax2.plot(turns, [p["computed_stateful"] for p in mt["per_turn"]], "s-", label="stateful (new tokens only)")
        ax2.xaxis.get_major_locator().set_params(integer=True)
        ax2.set_xlabel("turn")
        ax2.set_ylabel("prompt tokens computed")
        red = mt["token_reduction"]
        ax2.set_title(
            f"tokens computed per turn (reduction {red:.1%})" if red is not None else "tokens computed per turn"
        )
        ax2.grid(True, alpha=0.3)
        ax2.legend(fontsize=8)
    else:
        ax2.set_axis_off()
    mo = r["model"]
    fig.suptitle(
        f"engramctl bench: {mo['id']} ({mo.get('backend', 'transformers')}, {mo['dtype']}, {r['machine']['cpu']})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
