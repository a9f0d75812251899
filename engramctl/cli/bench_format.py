"""The bench reports' cells (times, rates, ratios) and tables, drawn by output.render_table."""

from __future__ import annotations

from typing import Sequence

from engramctl.cli.output import Column, render_table
from engramctl.units import human_bytes


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 10:
        return f"{ms:.0f} ms"
    return f"{ms:.1f} ms" if ms >= 1 else f"{ms:.2f} ms"


def fmt_spread(ms: float | None, spread: Sequence[float] | None) -> str:
    if ms is None:
        return "-"
    if not spread or len(spread) != 2 or spread[0] == spread[1]:
        return fmt_ms(ms)
    return f"{fmt_ms(ms)} [{fmt_ms(spread[0])}-{fmt_ms(spread[1])}]"


def fmt_rate(bps: float | None) -> str:
    if not bps:
        return "-"
    return f"{human_bytes(int(bps))}/s"


def fmt_x(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}x" if v >= 10 else f"{v:.1f}x"


def fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def fmt_int(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    """Rows of ready-made cells as the CLI's table; `right`: which columns align right (default all but the first)."""
    right = right or [i > 0 for i in range(len(headers))]
    columns = [
        Column(h, lambda row, i=i: row[i], ">" if r else "<", str) for i, (h, r) in enumerate(zip(headers, right))
    ]
    return render_table(rows, columns)


# -- the text report ----------------------------------------------------------------------------------
