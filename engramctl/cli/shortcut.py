"""The command lines main() runs without typer: `snapshots ls` with its own options (--json, -q/--quiet,
-s/--session NAME, --session=NAME). Building the Typer app imports typer, click and pydantic, several times
what a listing of thousands of snapshots costs; a script that lists in a loop pays it every time.

Only a line made of those options alone is run here, with flags.py's names and snapshots_ls.py's code (the Typer
command's own); anything else (--help, an unknown or repeated option, a missing or dash-led value, completion)
returns None and goes through Typer, so help, usage errors and their wording are Typer's alone. Failures are
reported as the Typer path reports them (failure.py)."""

from __future__ import annotations

import gc
import os
import sys

from engramctl.cli import flags

_SESSION_EQ = tuple(f"{name}=" for name in flags.SESSION if name.startswith("--"))


def ls_options(args: list[str]) -> dict | None:
    """`snapshots ls`'s options (after `snapshots ls`) as its keyword arguments; None: not one this parses."""
    options: dict = {"session": None, "json_": False, "quiet": False}
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg in flags.JSON:
            options["json_"] = True
        elif arg in flags.QUIET:
            options["quiet"] = True
        elif options["session"] is not None:
            return None  # a second --session: Typer's rule (the last one wins) is Typer's to apply
        elif arg in flags.SESSION and rest and not rest[0].startswith("-"):
            options["session"] = rest.pop(0)
        elif arg.startswith(_SESSION_EQ) and not arg.partition("=")[2].startswith("-") and arg.partition("=")[2]:
            options["session"] = arg.partition("=")[2]
        else:
            return None
    return options


def run(args: list[str]) -> int | None:
    """Run `args` (the command line without the program's name) when it is one this module runs, and return its
    exit code, the cyclic collector left off for the exit that follows (end()); None: it is not, Typer runs it."""
    if args[:2] != ["snapshots", "ls"] or any(k.endswith("_COMPLETE") for k in os.environ):
        return None
    options = ls_options(args[2:])
    if options is None:
        return None
    # from here to the exit the collector would only walk what the imports and the listing make (at 10,000 rows
    # some 250,000 objects, none in a cycle worth freeing first): ~11% of `snapshots ls --json`'s time (py-spy)
    gc.disable()
    from engramctl.cli import failure, snapshots_ls
    from engramctl.cli.output import Output

    try:
        _KEPT.append(snapshots_ls.ls(**options))
    except BaseException as e:  # as common.EngramGroup reports it
        code = failure.exit_code(e, Output())
        if code is None:
            raise
        return code
    return 0


_KEPT: list = []  # what run() listed, left for the process's exit to free (end())


def end(code: int) -> None:
    """Exit with `code` after what run() printed, without the interpreter's teardown: the listing's objects (at
    10,000 snapshots some 250,000 dicts, strings and lists, kept in _KEPT) go with the process's memory, not one
    by one and then again in a last collection (~5% of `snapshots ls --json`'s instructions at 10,000 rows,
    issue 46). What an exit does for others still happens: atexit's functions run and the streams are flushed."""
    import atexit

    from engramctl.cli.output import EXIT_ERROR

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with that descriptor closed: nothing to flush
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or a full disk: not all was written, as the interpreter says
            code = code or EXIT_ERROR
    os._exit(code)
