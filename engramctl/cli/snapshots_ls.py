"""`engramctl snapshots ls`: what it does, without typer, so that shortcut.py runs it as snapshots_read.py's Typer
command does. It asks the daemon when one is ready, else reads the store's index alone (listing.IndexSource)."""

from __future__ import annotations

import gc

from engramctl.cli.output import Column, output_for, size


def ls(session: str | None, json_: bool, quiet: bool) -> list[dict]:
    """List snapshots, oldest first (all sessions, or one with session); returns the rows it printed (shortcut.py
    leaves them to the exit to free)."""
    # a listing of 10,000 makes tens of thousands of dicts and lists, none in a cycle: without the cyclic collector
    # running dozens of times over them it takes ~15% less CPU (issue 46: `ls --json` <= 200 ms)
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _ls(session, json_, quiet)
    finally:
        if collecting:
            gc.enable()


def _ls(session: str | None, json_: bool, quiet: bool) -> list[dict]:
    from engramctl.cli.listing import open_listing

    out = output_for(json_, quiet)
    with open_listing(None, out, read_only=True) as listing:  # the settings loaded only where a daemon runs
        snaps = listing.snapshots(session)
    if not out.human:  # the columns (each id's shortest unique prefix among thousands) are the table's alone
        out.table(snaps, [], quiet_key="id")
        return snaps
    from engramctl.cli.snapshot_table import snapshot_columns

    columns = snapshot_columns(snaps, with_session=session is None)
    at = next((i + 1 for i, c in enumerate(columns) if c.header == "SIZE"), len(columns))
    columns.insert(at, Column("SHARED", "shared_size_bytes", ">", size))  # of SIZE, the KV blocks others use too
    out.table(
        snaps,
        columns,
        quiet_key="id",
        empty="No snapshots yet. Start one with: engramctl chat --session NAME",
    )
    return snaps
