"""What a failed command prints and exits with, on the Typer path (common.EngramGroup) and shortcut.py's alike:
`Error: <sentence>` then `Hint: <next command>` on stderr, and the documented exit code."""

from __future__ import annotations

import errno
import os
import sys

from engramctl.cli.output import EXIT_ERROR, Output
from engramctl.errors import EngramError


def sentence(text: str) -> str:
    """Capitalize a message that starts with a plain lowercase word (not a path, id or option)."""
    text = text.strip()
    first = text.split(" ", 1)[0]
    return text[:1].upper() + text[1:] if first.isalpha() and first.islower() else text


def exit_code(exc: BaseException, out: Output) -> int | None:
    """Report `exc` (an EngramError, an interrupt, a closed pipe, any other Exception) and return the exit code;
    None for what the caller lets propagate: ENGRAM_DEBUG's traceback, and what is not an Exception."""
    if isinstance(exc, EngramError):
        out.error(sentence(exc.message), exc.hint)
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        out.stderr.write("\n")
        return 130
    if isinstance(exc, BrokenPipeError):
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - quiet the interpreter's flush at exit
        return EXIT_ERROR
    if not isinstance(exc, Exception) or os.environ.get("ENGRAM_DEBUG"):
        return None
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:  # the machine's state, not a bug to report
        where = f" ({exc.filename})" if exc.filename else ""
        out.error(f"No space left on the device{where}.", "free some space (df -h shows where), then run it again")
        return EXIT_ERROR
    out.error(f"unexpected {type(exc).__name__}: {exc}", "rerun with ENGRAM_DEBUG=1 for a traceback, and report it")
    return EXIT_ERROR
