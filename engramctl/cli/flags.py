"""The names and help of the options that both the Typer commands declare (common.py, snapshots_common.py) and
shortcut.py parses without typer: one definition each, so a flag reads the same on either path."""

from __future__ import annotations

JSON = ("--json",)
JSON_HELP = "Print JSON on stdout."
QUIET = ("--quiet", "-q")
QUIET_HELP = "Print only ids/names, one per line."
SESSION = ("--session", "-s")
SESSION_METAVAR = "NAME"
SESSION_HELP = "Only this session."
