"""The snapshot table's columns (`snapshots ls`, the preview of `snapshots rm`). Imports nothing heavy: shortcut.py's
`snapshots ls` renders it without typer."""

from __future__ import annotations

from engramctl.cli.output import Column, ago, count, short_ids, size


def _flags(snap: dict) -> str:
    parts = []
    if snap.get("head_of"):
        parts.append("head")
    if snap.get("pinned"):
        parts.append("pinned")
    if not snap.get("durable", True):
        parts.append("writing")
    if snap.get("label"):
        parts.append(repr(snap["label"]) if " " in snap["label"] else snap["label"])
    return " ".join(parts)


def _tiers(snap: dict) -> str:
    return ",".join(snap.get("tiers") or []) or "-"


def snapshot_columns(snaps: list[dict], with_session: bool = True) -> list[Column]:
    short = short_ids(s["id"] for s in snaps)
    cols = [Column("ID", lambda s: short[s["id"]])]
    if with_session:
        cols.append(Column("SESSION", "session"))
    cols += [
        Column("TOKENS", "n_tokens", ">", count),
        Column("SIZE", "nbytes", ">", size),
        Column("TIERS", _tiers),
        Column("CREATED", "created", fmt=ago),
        Column("NOTES", _flags),
    ]
    return cols
