"""The engramctl command line. Importing this must not import torch: `--help` stays instant."""

from __future__ import annotations

import typer

from engramctl import __version__

app = typer.Typer(
    name="engramctl",
    help="Stateful local inference for Mamba/Mamba2 hybrid language models.",
    no_args_is_help=True,
    add_completion=True,
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


def main() -> None:
    app()
