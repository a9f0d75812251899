"""`snapshots ls` through main() runs without typer (cli/shortcut.py) and prints exactly what the Typer command
prints, failures included; every other command line, --help among them, goes through Typer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engramctl.cli import flags, shortcut
from tests.cli.conftest import seed_store

ROOT = Path(__file__).resolve().parents[2]

# what a listing of the index needs none of: each costs `snapshots ls` its import, typer most (click, pydantic);
# typing ~4% of its time (the modules on its path take TYPE_CHECKING without it); the settings (dataclasses, which
# imports inspect, and their own definitions) ~5%: with no daemon running a listing needs only paths.Paths
LEAN = (
    "engramctl.settings",
    "typer",
    "click",
    "pydantic",
    "engramctl.protocol",
    "engramctl.store.records",
    "torch",
    "numpy",
    "httpx",
    "typing",
)
# run the command line the way the console script does (main()), or through the Typer app alone (root.run);
# the last stderr line names those of LEAN that were imported by the exit
PROBE = f"""
import atexit, sys
LEAN = {LEAN!r}
# at the exit, whichever way it comes (shortcut.end runs atexit's functions, then exits without a teardown)
atexit.register(lambda: sys.stderr.write("\\nIMPORTED=" + ",".join(m for m in LEAN if m in sys.modules) + "\\n"))
from engramctl.cli import main
how, sys.argv = sys.argv[1], ["engramctl", *sys.argv[2:]]
if how == "main":
    main()
else:
    from engramctl.cli import root
    root.run(sys.argv[1:])
"""


def _run(how: str, args: list[str]) -> tuple[int, str, str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, how, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "\nIMPORTED=" in proc.stderr, proc.stderr  # atexit's functions ran, whichever way the process ended
    stderr, _, imported = proc.stderr.rpartition("\nIMPORTED=")
    return proc.returncode, proc.stdout, stderr, [m for m in imported.strip().split(",") if m]


def _same_table(text: str) -> list[str]:
    """A human table's words, its CREATED column's ages ("just now", "3s ago") left out: the runs are seconds
    apart."""
    return re.sub(r"just now|\S+ ago", "", text).split()


@pytest.mark.parametrize(
    "args",
    [
        ["--json"],
        [],
        ["-q"],
        ["--session", "demo", "--json"],
        ["-s", "other", "-q"],
        ["--session=demo"],
        ["--json", "-s", "nope"],  # an unknown session: Error/Hint, exit 1
        ["-s", "../x", "--json"],  # not a session name
        ["--json", "-q"],  # a usage error, exit 2
    ],
)
def test_main_prints_what_the_typer_command_prints(args):
    seed_store({"demo": 2, "other": 1}, pin=[("demo", 0)])
    code, out, err, imported = _run("main", ["snapshots", "ls", *args])
    assert imported == []  # the shortcut ran it, on the index alone
    t_code, t_out, t_err, t_imported = _run("typer", ["snapshots", "ls", *args])
    assert "typer" in t_imported  # the probe sees typer when the app runs
    assert (code, err) == (t_code, t_err)
    if "--json" in args or "-q" in args:
        assert out == t_out
    else:
        assert _same_table(out) == _same_table(t_out) and out.count("\n") == t_out.count("\n")
    if code:
        assert err.startswith("Error: ") and out == ""


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["-h"],
        ["--bogus"],
        ["--session"],  # no value
        ["--session", "--json"],  # a dash-led value: Typer's to read
        ["--session="],
        ["-sdemo"],
        ["-qs", "demo"],
        ["--json=1"],
        ["extra"],
        ["-s", "a", "-s", "b"],  # repeated: Typer's rule
        ["--", "-q"],
    ],
)
def test_other_lines_are_typers(args):
    assert shortcut.ls_options(args) is None
    assert shortcut.run(["snapshots", "ls", *args]) is None


def test_only_snapshots_ls_and_not_during_completion(monkeypatch):
    assert shortcut.run(["snapshots", "info", "x"]) is None
    assert shortcut.run(["sessions", "--json"]) is None
    assert shortcut.run([]) is None
    assert shortcut.ls_options(["-q", "--session", "demo"]) == {"session": "demo", "json_": False, "quiet": True}
    monkeypatch.setenv("_ENGRAMCTL_COMPLETE", "complete_bash")
    assert shortcut.run(["snapshots", "ls", "--json"]) is None


def test_the_shortcut_knows_every_option_of_the_command():
    """A new option on `snapshots ls` must be taught to shortcut.ls_options (or the shortcut dropped): a line
    that uses it would still reach Typer, but the shortcut's names are the command's, no more and no fewer."""
    import typer

    from engramctl.cli import app

    group = typer.main.get_command(app)
    ls = group.commands["snapshots"].commands["ls"]
    declared = {o for p in ls.params for o in (*p.opts, *p.secondary_opts)}
    assert declared == {*flags.JSON, *flags.QUIET, *flags.SESSION}
    assert {p.name for p in ls.params} == set(shortcut.ls_options([]))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("how", ["main", "typer"])
def test_a_full_disk_is_said_as_such_not_as_a_bug_to_report(how):
    seed_store({"demo": 2})
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, how, "snapshots", "ls", "--json"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("Error: No space left on the device"), proc.stderr
    assert "Hint: free some space" in proc.stderr and "report it" not in proc.stderr


@pytest.mark.parametrize("rows", [0, 2])
@pytest.mark.parametrize("args", [["-q"], ["--json"], []])
def test_a_listing_with_stdout_closed_ends_as_the_typer_command_does(args, rows):
    """Started with descriptor 1 closed (`engramctl snapshots ls -q >&-`): an empty quiet listing writes nothing
    and succeeds, as the Typer command does; one with something to write (rows, a JSON array) says that nothing was
    written and fails. Either way the exit has no stream to flush and no traceback."""
    if rows:
        seed_store({"demo": rows})
    runs = {}
    for how in ("main", "typer"):
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, how, "snapshots", "ls", *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
            preexec_fn=lambda: os.close(1),
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        runs[how] = (proc.returncode, proc.stderr.rpartition("\nIMPORTED=")[0])
    assert runs["main"] == runs["typer"]
    if args == ["-q"] and not rows:
        assert runs["main"] == (0, "")
    elif args or rows:
        closed = "Error: Standard output is closed: nothing was written.\nHint: run it again with > FILE\n"
        assert runs["main"] == (1, closed)
