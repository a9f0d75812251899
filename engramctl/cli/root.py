"""The whole command line as a Typer app: the root command, its --help epilog, and each group registered
in the order --help lists them. Importing this imports typer (and with it click and pydantic): main() comes here
for every command line but the ones shortcut.py runs itself."""

from __future__ import annotations

import os
import textwrap

import typer

from engramctl import __version__
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
# the top-level commands, each with the name of the group that registers it (_register)
_GROUP_OF = {
    "chat": "chat",
    "ps": "status",
    "sessions": "status",
    "models": "models",
    "tiers": "status",
    "snapshots": "snapshots",
    "bench": "bench",
    "mcp": "mcp",
    "serve": "daemon",
    "daemon": "daemon",
}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"engramctl {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Stateful local inference for Mamba/Mamba2 hybrid language models."""


def _register(app: typer.Typer, only: str | None = None) -> None:
    """Every command, in the order --help lists them; only: the commands of one group alone."""
    if only in (None, "chat"):
        from engramctl.cli import chat

        chat.register(app)
    if only in (None, "status", "models"):
        from engramctl.cli import models, status

        if only != "models":
            app.command("ps")(status.ps)
            app.command("sessions")(status.sessions)
        if only != "status":
            app.command("models")(models.models)
        if only != "models":
            app.command("tiers")(status.tiers)
    if only in (None, "snapshots"):
        from engramctl.cli import snapshots

        app.add_typer(snapshots.app, name="snapshots")
    if only in (None, "bench"):
        from engramctl.cli import bench

        app.add_typer(bench.app, name="bench")
    if only in (None, "mcp"):
        from engramctl.cli import mcp

        app.command("mcp")(mcp.mcp)
    if only in (None, "daemon"):
        from engramctl.cli import daemon

        daemon.register(app)  # serve, daemon ...


def build(only: str | None = None) -> typer.Typer:
    """The command line; only: just one group's commands (what main runs for a command line that names one)."""
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
    app.callback()(_root)
    _register(app, only)
    return app


def run(args: list[str]) -> None:
    """Run a command line (without the program's name) through Typer: a line that names a group builds that
    group alone, --help and completion the whole app."""
    group = _GROUP_OF.get(args[0]) if args else None
    if group is None or any(k.endswith("_COMPLETE") for k in os.environ):  # --help, completion: every command
        build()(args)
    else:
        build(group)(args)
