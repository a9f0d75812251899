"""`engramctl serve` (foreground) and `engramctl daemon start|stop|status|logs` (background).

The process work is engramctl.daemon's: runner.py (foreground) and background.py; this module only parses
flags and prints."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

import typer

from engramctl.cli import common
from engramctl.cli.common import JsonOpt, QuietOpt
from engramctl.cli.output import EXIT_UNREACHABLE, render_fields
from engramctl.errors import UsageError
from engramctl.protocol import same_model

app = typer.Typer(
    name="daemon", help="Start, stop and inspect the background daemon.", no_args_is_help=True, rich_markup_mode=None
)


def register(root: typer.Typer) -> None:
    root.command("serve")(serve)
    root.add_typer(app, name="daemon")


@common.daemon_setting_options
def serve(flags: dict[str, Any]) -> None:
    """Run the daemon in the foreground (logs on stderr; Ctrl-C stops it).

    Serves the OpenAI API (/v1/chat/completions, /v1/models) and the snapshot routes on loopback,
    with the bearer token from the config dir. Each option overrides its ENGRAM_* variable and
    config.toml key."""
    from engramctl.daemon.watch import foreground

    code = foreground(common.settings(**flags))
    if code:
        raise typer.Exit(code)


@app.command("start")
@common.daemon_setting_options
def start(flags: dict[str, Any], json_: bool = JsonOpt, quiet: bool = QuietOpt) -> None:
    """Start the daemon in the background and wait until it answers (loading the model).

    Each option overrides its ENGRAM_* variable and config.toml key."""
    from engramctl.daemon.background import daemon_status, start_background

    out = common.output(json_, quiet)
    st = common.settings(**flags)
    running = daemon_status(st)
    if running is not None:
        out.result(
            f"The daemon is already running ({_where(running)}).",
            json_obj={**running, "already_running": True},
            quiet_lines=[str(running.get("pid", ""))],
        )
        _mismatch(out, running, st.model, st.backend)
        return
    with out.spinner("starting the daemon (loading the model)"):
        info = start_background(st, wait=True)
    info = info or {}
    for notice in info.get("notices") or ():  # e.g. the SmolLM2 fallback, worded by the daemon
        out.note(notice)
    out.result(
        f"Daemon started ({_where(info)}).",
        json_obj={**info, "already_running": False},
        quiet_lines=[str(info.get("pid", ""))],
    )


@app.command("stop")
def stop(json_: bool = JsonOpt, quiet: bool = QuietOpt) -> None:
    """Stop the background daemon (pending snapshot writes finish first)."""
    from engramctl.daemon.background import stop_background

    out = common.output(json_, quiet)
    st = common.settings()
    with out.spinner("stopping the daemon"):
        stopped = stop_background(st)
    out.result("Daemon stopped." if stopped else "No daemon was running.", json_obj={"stopped": bool(stopped)})


@app.command("status")
def status(json_: bool = JsonOpt, quiet: bool = QuietOpt) -> None:
    """Is the daemon running, and with what. Exit code 3 when it is not running."""
    from engramctl.cli.status import daemon_fields
    from engramctl.daemon.background import daemon_status, last_death

    out = common.output(json_, quiet)
    st = common.settings()
    info = daemon_status(st)
    if info is None:
        death = last_death(st)
        if out.json:
            out.emit_json({"running": False, **({"last_death": death} if death else {})})
        elif death:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(death["at"]))
            how = death["message"].removeprefix("the daemon ")
            out.note(f"No daemon is running: the last one (pid {death['pid']}) {how} ({when}).")
            if death.get("log"):
                out.note("Its log ended:\n  " + death["log"].replace("\n", "\n  "))
            out.note(f"Hint: {death['hint']}" if death.get("hint") else "Start one: engramctl daemon start")
        else:
            out.note("No daemon is running. Start one: engramctl daemon start")
        raise typer.Exit(EXIT_UNREACHABLE)
    if out.json:
        out.emit_json({"running": True, **info})
    elif out.quiet:
        out.line(str(info.get("pid", "")))
    else:
        out.line(render_fields(daemon_fields(info)))


@app.command("logs")
def logs(
    lines: int = typer.Option(50, "--lines", "-n", min=0, help="How many of the last lines to show."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines (Ctrl-C stops)."),
    path: bool = typer.Option(False, "--path", help="Only print the log file's path."),
) -> None:
    """Show the daemon's log."""
    from engramctl.daemon.rundir import log_file

    out = common.output()
    st = common.settings()
    f = Path(log_file(st))
    if path:
        out.line(str(f))
        return
    if not f.is_file():
        raise UsageError(f"no daemon log yet at {f}.", hint="engramctl daemon start")
    with f.open("r", encoding="utf-8", errors="replace") as fh:
        for ln in deque(fh, maxlen=lines) if lines else ():
            out.write(ln)
        if not follow:
            return
        try:
            while True:
                ln = fh.readline()
                if ln:
                    out.write(ln)
                else:
                    time.sleep(0.25)
        except KeyboardInterrupt:
            return


def _where(info: dict) -> str:
    parts = []
    if info.get("pid"):
        parts.append(f"pid {info['pid']}")
    url = info.get("url") or (f"http://{info.get('host')}:{info.get('port')}" if info.get("port") else None)
    if url:
        parts.append(url)
    if info.get("model"):
        parts.append(f"model {info['model']}")
    return ", ".join(parts) or "running"


def _mismatch(out: Any, running: dict, model: str | None, backend: str) -> None:
    """Warn when the running daemon is not what these settings ask for (it is not restarted for it)."""
    switch = "To switch: engramctl daemon stop && engramctl daemon start"
    if model and running.get("model") and not same_model(model, running["model"]):
        out.warn(f"it serves {running['model']}, not {model}. {switch} --model {model}")
    elif backend != "auto" and running.get("backend") and running["backend"] != backend:
        out.warn(f"it runs the model on {running['backend']}, not {backend}. {switch} --backend {backend}")
