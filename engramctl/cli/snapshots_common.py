"""What the `engramctl snapshots` commands share: the ID argument, the --session option, the way to the
daemon (every change) and to a listing (reads). The snapshot table's columns are snapshot_table.py's."""

from __future__ import annotations

from typing import Any

import typer

from engramctl.cli import flags
from engramctl.cli.complete import complete_session, complete_snapshot
from engramctl.store.names import MIN_ID_PREFIX

IdArg = typer.Argument(
    ...,
    metavar="ID",
    autocompletion=complete_snapshot,
    help=f"Snapshot id or a unique prefix ({MIN_ID_PREFIX}+ characters).",
)
SessionOpt = typer.Option(
    None, *flags.SESSION, metavar=flags.SESSION_METAVAR, help=flags.SESSION_HELP, autocompletion=complete_session
)


def read_listing(settings: Any, out: Any):
    """The listing: the daemon's when it runs, else the store's (listing.open_listing)."""
    from engramctl.cli.listing import open_listing

    return open_listing(settings, out)


def daemon_client(settings: Any, out: Any) -> Any:
    """The daemon's client: every change goes through the daemon (started first when none runs)."""
    from engramctl.cli.connect import connect

    return connect(settings, out)[0]


def listing_over(client: Any) -> Any:
    """A listing over the daemon's client: what a change shows before it is made."""
    from engramctl.cli.listing import over

    return over(client)
