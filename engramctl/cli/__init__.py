"""The engramctl command line. Importing this must not import torch: `--help` stays instant.

One module per command group; every module imports its heavy dependencies (store, client, engine)
inside the command functions. All output goes through engramctl.cli.output.
"""

from __future__ import annotations

import textwrap

import typer

from engramctl import __version__
from engramctl.cli import bench, chat, daemon, mcp, models, snapshots, status
from engramctl.cli.common import EngramGroup
from engramctl.settings import env_help

ENV_NOTE = (
    "ENGRAM_HOME keeps data, config, logs and caches under one directory; the others are explained in engramctl "
    "serve --help and the README. Config file: config.toml in the config dir (engramctl snapshots path --json), "
    "with the variables' names in lower case, without ENGRAM_, as keys."
)
EPILOG = "\n".join(
    [
        "\b",
        "Exit codes: 0 ok, 1 error, 2 usage error, 3 daemon unreachable, 130 interrupted.",
        "stdout carries data only; progress, notes and errors go to stderr.",
        "\b",  # the env list is generated from engramctl.settings: wrap it here, not by click
        *textwrap.wrap(f"{env_help()} {ENV_NOTE}", 100, break_on_hyphens=False),
    ]
)

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
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Stateful local inference for Mamba/Mamba2 hybrid language models."""


chat.register(app)
app.command("ps")(status.ps)
app.command("sessions")(status.sessions)
app.command("models")(models.models)
app.command("tiers")(status.tiers)
app.add_typer(snapshots.app, name="snapshots")
app.add_typer(bench.app, name="bench")
app.command("mcp")(mcp.mcp)
daemon.register(app)  # serve, daemon ...


def main() -> None:
    app()
