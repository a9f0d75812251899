"""The interactive chat loop: input (readline, history, multi-line), slash commands, Ctrl-C/Ctrl-D.

One table of slash commands both dispatches and generates the `/?` help. The conversation itself
(streaming a turn, saving, branching) is ChatSession's job (conversation.py); this module only reads lines
and routes them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, TextIO

from engramctl.cli.conversation import ChatSession
from engramctl.cli.output import Output, count, ms, size
from engramctl.errors import EngramError

PROMPT, CONTINUATION = ">>> ", "... "
FENCE = '"""'
EXIT_HINT = "Use /bye or Ctrl-D to exit."
HISTORY_FILE = "chat_history"
HISTORY_LENGTH = 1000


@dataclass(frozen=True)
class Slash:
    name: str
    args: str
    help: str
    run: Callable[["Repl", str], bool]  # returns False to leave the REPL
    aliases: tuple[str, ...] = ()


COMMANDS: list[Slash] = []


def slash(name: str, args: str, help: str, aliases: tuple[str, ...] = ()) -> Callable:
    def register(fn: Callable[["Repl", str], bool | None]) -> Callable:
        COMMANDS.append(Slash(name, args, help, lambda repl, arg: fn(repl, arg) is not False, aliases))
        return fn

    return register


def find(word: str) -> Slash | None:
    for c in COMMANDS:
        if word == c.name or word in c.aliases:
            return c
    return None


def help_text() -> str:
    rows = [(f"{c.name} {c.args}".rstrip(), c.help) for c in COMMANDS]
    width = max(len(a) for a, _ in rows)
    lines = ["Commands:"] + [f"  {a:<{width}}  {h}" for a, h in rows]
    lines += ["", f"Start and end a multi-line message with {FENCE}.", "Ctrl-C stops a reply; Ctrl-D or /bye exits."]
    return "\n".join(lines)


# -- the commands -------------------------------------------------------------------------------------
@slash("/?", "", "Show this help.", aliases=("/help",))
def _help(repl: "Repl", arg: str) -> None:
    repl.out.note(help_text())


@slash("/bye", "", "Exit.", aliases=("/exit", "/quit"))
def _bye(repl: "Repl", arg: str) -> bool:
    return False


@slash("/save", "[LABEL]", "Pin a (labelled) snapshot of the conversation as it is now.")
def _save(repl: "Repl", arg: str) -> None:
    snap = repl.chat.save(arg.strip() or None)
    label = f" as {snap['label']!r}" if snap.get("label") else ""
    repl.out.note(
        f"Saved snapshot {snap['id'][:12]}{label} ({count(snap.get('n_tokens'))} tokens, "
        f"{size(snap.get('nbytes'))}); pinned."
    )


@slash("/branch", "NAME", "Fork the conversation here and continue in the new session NAME.")
def _branch(repl: "Repl", arg: str) -> None:
    name = arg.strip()
    if not name:
        repl.out.error("/branch needs a name.", "/branch my-idea")
        return
    old = repl.chat.session
    repl.chat.branch(name)
    repl.out.note(
        f"Branched {old!r} into {name!r}; now in {name!r}. Back to the original: engramctl chat --session {old}"
    )


@slash("/history", "", "Show the conversation so far.")
def _history(repl: "Repl", arg: str) -> None:
    messages = repl.chat.history()
    if not messages:
        repl.out.note("(no messages yet)")
    for m in messages:
        repl.out.note(f"{m.get('role', '?')}: {m.get('content', '')}")


@slash("/stats", "", "Tokens in the state, snapshot size, last time to first token and tokens/s.")
def _stats(repl: "Repl", arg: str) -> None:
    s = repl.chat.stats()
    tps = s.get("tokens_per_s")
    repl.out.note(
        "\n".join(
            [
                f"session          {s['session']}",
                f"model            {s.get('model') or '-'}",
                f"tokens in state  {count(s.get('state_tokens'))}",
                f"snapshot         {(s.get('snapshot_id') or '-')[:12]}  {size(s.get('snapshot_bytes'))}",
                f"time to first    {ms(s.get('ttft_ms'))}",
                f"tokens/s         {'-' if tps is None else f'{tps:.1f}'}",
                f"turns            {s.get('turns', 0)}",
            ]
        )
    )


def kept_note(session: str, reset: dict | None) -> str:
    """`; its N earlier snapshot(s) are kept (...)` after a reset (/clear, chat --new), or nothing when none were."""
    n = (reset or {}).get("kept_snapshots") or 0
    return f"; its {n} earlier snapshot(s) are kept (engramctl snapshots ls --session {session})" if n else ""


@slash("/clear", "", "Start this session's conversation over (its old snapshots are kept).")
def _clear(repl: "Repl", arg: str) -> None:
    res = repl.chat.clear()
    name = repl.chat.session
    repl.out.note(f"Cleared: the next message starts {name!r} from an empty state{kept_note(name, res)}.")


# -- input --------------------------------------------------------------------------------------------
class LineReader:
    """Lines from the terminal (readline editing + persistent history) or from any text stream."""

    def __init__(self, out: Output, stream: TextIO | None = None, history_path: Path | None = None, tty: bool = False):
        self.out, self.stream, self.tty = out, stream, tty
        self.history_path = history_path
        self._readline = None
        if tty and stream is None:
            self._readline = _setup_readline(history_path)

    def read(self, prompt: str) -> str:
        """One line without its newline. EOFError at the end, KeyboardInterrupt on Ctrl-C."""
        if self.stream is not None and not self.tty:
            line = self.stream.readline()
            if not line:
                raise EOFError
            return line.rstrip("\n").rstrip("\r")
        if self.out.stdout_tty():
            return input(prompt)  # readline needs to own the prompt to redraw it
        self.out.stderr.write(prompt)  # stdout is data (redirected): keep the prompt off it
        self.out.stderr.flush()
        return input("")

    def save(self) -> None:
        if self._readline is not None and self.history_path is not None:
            try:
                self._readline.set_history_length(HISTORY_LENGTH)
                self._readline.write_history_file(str(self.history_path))
                os.chmod(self.history_path, 0o600)
            except OSError:
                pass


def _setup_readline(history_path: Path | None):
    try:
        import readline
    except ImportError:  # Windows without pyreadline: plain input()
        return None
    if history_path is not None:
        try:
            history_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if history_path.exists():
                readline.read_history_file(str(history_path))
        except OSError:
            pass
    names = [c.name for c in COMMANDS] + [a for c in COMMANDS for a in c.aliases]

    def complete(text: str, state: int) -> str | None:
        hits = [n for n in names if n.startswith(text)] if text.startswith("/") else []
        return hits[state] if state < len(hits) else None

    readline.set_completer(complete)
    readline.set_completer_delims(" \t\n")
    readline.parse_and_bind("tab: complete")
    return readline


def messages(reader: LineReader) -> Iterator[str]:
    """Complete user inputs: single lines, or \"\"\"-fenced blocks joined with newlines."""
    while True:
        line = reader.read(PROMPT)
        stripped = line.strip()
        if stripped.startswith(FENCE):
            rest = stripped[len(FENCE) :]
            if rest.endswith(FENCE) and len(rest) >= len(FENCE):
                yield rest[: -len(FENCE)]
                continue
            parts = [rest] if rest else []
            while True:
                nxt = reader.read(CONTINUATION)
                if nxt.rstrip().endswith(FENCE):
                    tail = nxt.rstrip()[: -len(FENCE)]
                    if tail:
                        parts.append(tail)
                    break
                parts.append(nxt)
            yield "\n".join(parts)
        else:
            yield line


# -- the loop -----------------------------------------------------------------------------------------
class Repl:
    def __init__(self, chat: ChatSession, out: Output, reader: LineReader):
        self.chat, self.out, self.reader = chat, out, reader

    def run(self) -> int:
        if self.reader.tty:
            self.out.dim(f"Type a message, /? for help, {FENCE} for multi-line; Ctrl-D or /bye exits.")
        try:
            return self._loop()
        finally:
            self.reader.save()

    def _loop(self) -> int:
        inputs = messages(self.reader)
        while True:
            try:
                text = next(inputs)
            except KeyboardInterrupt:
                self.out.stderr.write("\n")
                self.out.note(EXIT_HINT)
                inputs = messages(self.reader)  # drop a half-typed multi-line block
                continue
            except (EOFError, StopIteration):
                if self.reader.tty:
                    self.out.stderr.write("\n")
                return 0
            if not text.strip():
                continue
            if text.startswith("/") and "\n" not in text:
                word, _, arg = text.strip().partition(" ")
                cmd = find(word)
                if cmd is None:
                    self.out.error(f"unknown command {word!r}.", "/? lists the commands")
                    continue
                try:
                    if not cmd.run(self, arg):
                        return 0
                except EngramError as e:
                    if e.exit_code == 3:
                        raise
                    self.out.error(e.message, e.hint)
                continue
            try:
                self.chat.send(text)
            except EngramError as e:
                if e.exit_code == 3:
                    raise
                self.out.error(e.message, e.hint)
