"""All terminal output goes through here.

stdout carries data only (tables, JSON, the chat reply); stderr carries everything else (progress,
headers, notes, warnings, errors). Three modes:

    human  borderless tables with UPPERCASE headers, human sizes and times
    json   exactly one JSON document on stdout (NDJSON for streams); notes still go to stderr
    quiet  ids/names only, one per line; notes are dropped, warnings and errors are not

Errors print as `Error: <sentence>` then `Hint: <next command>` on stderr. Exit codes: 0 ok,
1 error, 2 usage, 3 daemon unreachable (the EngramError subclasses carry their own).

Nothing heavy is imported here: `engramctl --help` and completion load this module. json, orjson and threading are
imported where they are used: `snapshots ls` in a table or quiet needs none of them (orjson alone imports datetime,
uuid and platform).
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections import namedtuple
from collections.abc import Callable, Iterable, Sequence

from engramctl.errors import EngramError, UsageError
from engramctl.units import human_bytes, human_duration

TYPE_CHECKING = False  # typing's, without importing typing: `snapshots ls` imports none of it (~4% of its time)
if TYPE_CHECKING:
    from typing import Any, TextIO

    from typing_extensions import Self

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
EXIT_CODES_HELP = "Exit codes: 0 ok, 1 error, 2 usage error, 3 daemon unreachable, 130 interrupted."

HUMAN, JSON, QUIET = "human", "json", "quiet"


class StdoutClosed(EngramError):
    """Data to print and no standard output to print it to."""


def _tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _color_ok(stream: TextIO) -> bool:
    return _tty(stream) and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


# -- formatting helpers -------------------------------------------------------------------------------
def size(n: int | None) -> str:
    return human_bytes(n)


def ago(ts: float | None, now: float | None = None) -> str:
    if not ts:
        return "-"
    delta = (time.time() if now is None else now) - ts
    if delta < 5:
        return "just now"
    return f"{human_duration(delta)} ago"


def timestamp(ts: float | None) -> str:
    if not ts:
        return "-"
    from datetime import datetime  # here: a listing (snapshots ls) formats no timestamp

    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def yes_no(v: Any) -> str:
    return "yes" if v else "no"


def short_ids(ids: Iterable[str], minimum: int = 12) -> dict[str, str]:
    """Shortest unique prefix of each id (at least `minimum` chars), like git's abbreviated hashes.
    Snapshot ids start with a millisecond timestamp, so short prefixes collide; 12 is the floor."""
    ordered = sorted(set(ids))
    # the prefix each id shares with the next one in order: an id's neighbours are the only ones it can collide with
    shared = [_common_prefix(a, b) for a, b in itertools.pairwise(ordered)]
    out: dict[str, str] = {}
    for i, sid in enumerate(ordered):
        need = max(minimum, shared[i - 1] + 1 if i else 0, shared[i] + 1 if i < len(shared) else 0)
        out[sid] = sid[: min(need, len(sid))]
    return out


def _common_prefix(a: str, b: str) -> int:
    """The length of the prefix a and b share, by bisection on slices (compared in C, not a character at a time)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


# header; key: a row's key, or a function of the row; align: "<" or ">"; fmt: the value's text (None: str, "-" for
# nothing). A named tuple, not a dataclass: dataclasses imports inspect, which `snapshots ls` need not (paths.py)
_ColumnFields = namedtuple("_ColumnFields", "header key align fmt", defaults=("<", None))


class Column(_ColumnFields):
    __slots__ = ()

    def cell(self, row: dict) -> str:
        return self.cells([row])[0]

    def cells(self, rows: Sequence[dict]) -> list[str]:
        """The column's text in each row: its formatter's, else the value, "-" when None or empty."""
        key = self.key
        values = [key(r) for r in rows] if callable(key) else [r.get(key) for r in rows]
        if self.fmt is not None:
            return [self.fmt(v) for v in values]
        return ["-" if v is None or v == "" else str(v) for v in values]


def render_table(rows: Sequence[dict], columns: Sequence[Column], gap: int = 2) -> str:
    """A borderless table: UPPERCASE headers, columns separated by two spaces, no trailing blanks."""
    texts = [[c.header.upper(), *c.cells(rows)] for c in columns]  # column by column: each key resolved once
    padded = []
    for i, (col, text) in enumerate(zip(columns, texts)):
        width = max(map(len, text))
        if col.align == ">":
            padded.append([t.rjust(width) for t in text])
        else:
            padded.append(text if i == len(columns) - 1 else [t.ljust(width) for t in text])
    sep = " " * gap
    return "\n".join(sep.join(parts).rstrip() for parts in zip(*padded))


def render_fields(fields: Sequence[tuple[str, Any]]) -> str:
    """KEY  value lines, keys UPPERCASE and aligned (the `info` view)."""
    width = max((len(k) for k, _ in fields), default=0)
    return "\n".join(f"{k.upper():<{width}}  {'-' if v is None or v == '' else v}".rstrip() for k, v in fields)


# -- the output object --------------------------------------------------------------------------------
class Output:
    def __init__(self, mode: str = HUMAN, *, stdout: TextIO | None = None, stderr: TextIO | None = None):
        self.mode = mode
        self._stdout = stdout
        self._stderr = stderr

    # Streams are looked up at call time so test runners that swap sys.stdout see the output.
    @property
    def stdout(self) -> TextIO:
        stream = self._stdout or sys.stdout
        if stream is None:  # started with descriptor 1 closed (`>&-`): data has nowhere to go
            raise StdoutClosed("standard output is closed: nothing was written.", hint="run it again with > FILE")
        return stream

    @property
    def stderr(self) -> TextIO:
        return self._stderr or sys.stderr

    @property
    def json(self) -> bool:
        return self.mode == JSON

    @property
    def quiet(self) -> bool:
        return self.mode == QUIET

    @property
    def human(self) -> bool:
        return self.mode == HUMAN

    def stderr_tty(self) -> bool:
        return _tty(self.stderr)

    def stdout_tty(self) -> bool:
        return _tty(self._stdout or sys.stdout)

    # -- data (stdout) -------------------------------------------------------------------------------
    def write(self, text: str, *, end: str = "", flush: bool = True) -> None:
        """Raw data to stdout (a streamed reply)."""
        self.stdout.write(text + end)
        if flush:
            self.stdout.flush()

    def line(self, text: str = "") -> None:
        self.write(text, end="\n")

    def emit_json(self, obj: Any) -> None:
        """One JSON document and a newline. Where stdout is UTF-8 text over a byte stream, orjson's bytes go to
        the bytes (6.5 MB at 10,000 snapshots: decoding, copying and encoding them again cost as much as writing)."""
        data = _orjson_bytes(obj)
        stream = self.stdout
        buffer = getattr(stream, "buffer", None)
        if (
            data is None
            or buffer is None
            or (getattr(stream, "encoding", None) or "").lower().replace("-", "") != "utf8"
        ):
            self.line(dumps_indented(obj) if data is None else data.decode())
            return
        stream.flush()  # what was written as text before goes first
        buffer.write(data)
        buffer.write(b"\n")
        buffer.flush()

    def event(self, obj: dict) -> None:
        """One NDJSON line (streams)."""
        import json

        self.line(json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=_json_default))

    def table(
        self,
        rows: Sequence[dict],
        columns: Sequence[Column],
        *,
        json_rows: Any = None,
        quiet_key: str | Callable[[dict], str] = "id",
        empty: str | None = None,
    ) -> None:
        """A list: a table (human), a JSON array (json), or one `quiet_key` per line (quiet)."""
        if self.json:
            self.emit_json(list(rows) if json_rows is None else json_rows)
        elif self.quiet:  # one write: a line each would be a write(2) each (10,000 for `snapshots ls -q`)
            key = quiet_key if callable(quiet_key) else (lambda r: r[quiet_key])
            if rows:
                self.write("".join(f"{key(r)}\n" for r in rows))
        elif rows:
            self.line(render_table(rows, columns))
        elif empty:
            self.note(empty)

    def fields(self, fields: Sequence[tuple[str, Any]], *, json_obj: Any, quiet_value: str | None = None) -> None:
        """One object: KEY value lines (human), a JSON object (json), one value (quiet)."""
        if self.json:
            self.emit_json(json_obj)
        elif self.quiet:
            if quiet_value is not None:
                self.line(quiet_value)
        else:
            self.line(render_fields(fields))

    def result(self, message: str, *, json_obj: Any, quiet_lines: Iterable[str] = ()) -> None:
        """The outcome of a command that changed something: a sentence on stderr (human), a JSON
        object on stdout (json), or the affected ids on stdout (quiet)."""
        if self.json:
            self.emit_json(json_obj)
        elif self.quiet:
            for q in quiet_lines:
                self.line(q)
        else:
            self.note(message)

    # -- everything else (stderr) --------------------------------------------------------------------
    def _err(self, text: str) -> None:
        self.stderr.write(text + "\n")
        self.stderr.flush()

    def _style(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if _color_ok(self.stderr) else text

    def note(self, text: str) -> None:
        """Progress and confirmations; dropped in quiet mode."""
        if not self.quiet:
            self._err(text)

    def dim(self, text: str) -> None:
        if not self.quiet:
            self._err(self._style(text, "2"))

    def warn(self, text: str) -> None:
        self._err(f"{self._style('Warning:', '33;1')} {text}")

    def error(self, message: str, hint: str | None = None) -> None:
        self._err(f"{self._style('Error:', '31;1')} {message}")
        if hint:
            self._err(f"{self._style('Hint:', '36')} {hint}")

    def spinner(self, text: str) -> Spinner:
        return Spinner(self.stderr, text, enabled=self.stderr_tty() and not self.quiet)

    def confirm(self, question: str, *, stdin: TextIO | None = None) -> bool:
        """Ask on the terminal; only call when stdin is a terminal."""
        self.stderr.write(f"{question} [y/N] ")
        self.stderr.flush()
        answer = (stdin or sys.stdin).readline()
        return answer.strip().lower() in ("y", "yes")


def output_for(json_: bool = False, quiet: bool = False) -> Output:
    """The Output of a command's --json/--quiet flags."""
    if json_ and quiet:
        raise UsageError("--json and --quiet cannot be combined.", hint="pick one")
    return Output(JSON if json_ else QUIET if quiet else HUMAN)


def dumps_indented(obj: Any) -> str:
    """`json.dumps(obj, indent=2, ensure_ascii=False, default=_json_default)`'s JSON, written by orjson's C encoder:
    with an indent the standard library takes its pure-Python encoder, most of `snapshots ls --json`'s time at
    10,000 rows. The same text but for a float's exponent (1e16 for 1e+16: the same number) and NaN or infinity,
    which are not JSON (json.dumps writes NaN, a strict reader refuses it): null. What orjson refuses (a non-str
    key, an int past 64 bits, a lone surrogate) the standard library writes."""
    data = _orjson_bytes(obj)
    if data is not None:
        return data.decode()
    import json

    return json.dumps(obj, indent=2, ensure_ascii=False, default=_json_default)


def _orjson_bytes(obj: Any) -> bytes | None:
    """dumps_indented's text in UTF-8, from orjson; None where orjson refuses it (or is missing)."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    # every object but dicts, lists, tuples and exact scalars goes through _json_default, as with json.dumps
    option = (
        orjson.OPT_INDENT_2
        | orjson.OPT_PASSTHROUGH_DATACLASS
        | orjson.OPT_PASSTHROUGH_DATETIME
        | orjson.OPT_PASSTHROUGH_SUBCLASS
    )
    try:
        return orjson.dumps(obj, default=_json_default, option=option)
    except TypeError:  # orjson.JSONEncodeError
        return None


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if hasattr(obj, "__fspath__"):
        return os.fspath(obj)
    raise TypeError(f"cannot serialize {type(obj).__name__}")


class Spinner:
    """A one-line spinner on stderr while waiting (first token, daemon start). No-op off a terminal."""

    FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(self, stream: TextIO, text: str, enabled: bool = True, interval: float = 0.08):
        import threading  # here: most commands draw no spinner

        self.stream, self.text, self.enabled, self.interval = stream, text, enabled, interval
        self._stop = threading.Event()
        self._thread: Any = None  # a threading.Thread while it draws
        self._lock = threading.Lock()
        self._shown = False

    def start(self) -> Self:
        if self.enabled and self._thread is None:
            import threading

            self._thread = threading.Thread(target=self._run, name="spinner", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(self.interval if i else 0.15):
            with self._lock:
                if self._stop.is_set():
                    break
                self.stream.write(f"\r{self.FRAMES[i % len(self.FRAMES)]} {self.text}\x1b[K")
                self.stream.flush()
                self._shown = True
            i += 1

    def update(self, text: str) -> None:
        self.text = text

    def stop(self) -> None:
        """Stop and erase the spinner line. Idempotent; safe to call before any frame was drawn."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)
            self._thread = None
        with self._lock:
            if self._shown:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self._shown = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
