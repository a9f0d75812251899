"""What the `engramctl snapshots` commands share: the ID argument, the --session option, the way to the
daemon (every change) and to a listing (reads), and the snapshot table's columns."""

from __future__ import annotations

from typing import Any

import typer

from engramctl.cli.complete import complete_session, complete_snapshot
from engramctl.cli.output import Column, ago, count, short_ids, size
from engramctl.store.names import MIN_ID_PREFIX

IdArg = typer.Argument(
    ...,
    metavar="ID",
    autocompletion=complete_snapshot,
    help=f"Snapshot id or a unique prefix ({MIN_ID_PREFIX}+ characters).",
)
SessionOpt = typer.Option(
    None, "--session", "-s", metavar="NAME", help="Only this session.", autocompletion=complete_session
)


def read_listing(settings: Any, out: Any, *, read_only: bool = False):
    """The listing: the daemon's when it runs, else the store's (read_only: listing.open_listing)."""
    from engramctl.cli.listing import open_listing

    return open_listing(settings, out, read_only=read_only)


def daemon_client(settings: Any, out: Any) -> Any:
    """The daemon's client: every change goes through the daemon (started first when none runs)."""
    from engramctl.cli.connect import connect

    return connect(settings, out)[0]


def listing_over(client: Any) -> Any:
    """A listing over the daemon's client: what a change shows before it is made."""
    from engramctl.cli.listing import over

    return over(client)


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
