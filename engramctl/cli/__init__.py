"""The engramctl command line. Importing this imports nothing but the standard library: `--help` stays instant,
and `snapshots ls` runs without typer (shortcut.py).

One module per command group, in the Typer app root.py builds; every module imports its heavy dependencies
(store, client, engine) inside the command functions. All output goes through engramctl.cli.output.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing's, without importing typing: `snapshots ls` imports none of it (~4% of its time)
if TYPE_CHECKING:
    from typing import Any


def __getattr__(name: str) -> Any:
    """`app`, the whole command line as a Typer app, made on first use (tests and completion scripts use it)."""
    if name == "app":
        from engramctl.cli.root import build

        app = globals()["app"] = build()
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """The console script: the command lines shortcut.py knows run there, every other one through Typer."""
    from engramctl.cli import shortcut

    args = sys.argv[1:]
    code = shortcut.run(args)
    if code is not None:
        shortcut.end(code)
    from engramctl.cli.root import run

    run(args)
