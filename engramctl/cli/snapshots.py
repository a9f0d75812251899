"""`engramctl snapshots ...`: list, inspect, delete, branch, pin, export/import, gc.

One module per kind of subcommand: snapshots_read.py (ls, info, export, path: they ask the daemon when it
runs, else read the store through listing.py), snapshots_rm.py (rm), snapshots_change.py (branch, pin,
unpin, import, gc: every change goes through the daemon's client, connect.py, which starts the daemon first
when none runs); what they share is snapshots_common.py. Ids may be abbreviated to any unique prefix
(store.names.MIN_ID_PREFIX+ hex digits), resolved by the store's rule wherever they are read."""

from __future__ import annotations

import typer

from engramctl.cli import snapshots_change, snapshots_read, snapshots_rm

app = typer.Typer(
    name="snapshots",
    help="List, inspect, delete, branch, pin, export and import snapshots.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

app.command("ls")(snapshots_read.ls)
app.command("info")(snapshots_read.info)
app.command("rm")(snapshots_rm.rm)
app.command("branch")(snapshots_change.branch)
app.command("pin")(snapshots_change.pin)
app.command("unpin")(snapshots_change.unpin)
app.command("export")(snapshots_read.export)
app.command("import")(snapshots_change.import_)
app.command("gc")(snapshots_change.gc)
app.command("path")(snapshots_read.path)
