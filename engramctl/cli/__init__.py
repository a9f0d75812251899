"""The engramctl command line. Importing this must not import torch: `--help` stays instant.

One module per command group; every module imports its heavy dependencies (store, client, engine)
inside the command functions. All output goes through engramctl.cli.output.
"""

from __future__ import annotations

import typer

from engramctl import __version__
from engramctl.cli import bench, chat, daemon, mcp, models, snapshots, status
from engramctl.cli.common import EngramGroup

EPILOG = """\b
Exit codes: 0 ok, 1 error, 2 usage error, 3 daemon unreachable, 130 interrupted.
stdout carries data only; progress, notes and errors go to stderr.
\b
Environment: ENGRAM_HOME (all data under one dir), ENGRAM_MODEL, ENGRAM_HOST, ENGRAM_PORT,
ENGRAM_API_KEY, ENGRAM_NO_AUTOSTART=1, ENGRAM_TIER_{VRAM,RAM,DISK}_BYTES, ENGRAM_KEEP_LAST,
ENGRAM_SESSION_TTL_S. Config file: config.toml in the config dir (engramctl snapshots path --json).
"""

app = typer.Typer(
    name="engramctl",
    help="Stateful local inference for Mamba/Mamba2 hybrid language models.",
    epilog=EPILOG,
    cls=EngramGroup,
    no_args_is_help=True,
    add_completion=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"engramctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Stateful local inference for Mamba/Mamba2 hybrid language models."""


chat.register(app)
app.command("ps")(status.ps)
app.command("sessions")(status.sessions)
app.command("models")(models.models)
app.command("tiers")(status.tiers)
app.add_typer(snapshots.app, name="snapshots")
app.command("bench")(bench.bench)
app.command("mcp")(mcp.mcp)
daemon.register(app)  # serve, daemon ...


def main() -> None:
    app()
