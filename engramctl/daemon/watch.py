"""The daemon's watcher: runs `python -m engramctl.daemon` as its child and, when that child dies by a signal (SIGILL
from a llama.cpp build this CPU does not run, SIGSEGV, the OOM killer's SIGKILL), says so in words instead of leaving
an exit code: in the log and the run dir's last_exit.json (exits.py) for a background daemon, and as the command's
error for `engramctl serve`.

    python -m engramctl.daemon.watch        a background daemon (background.py starts it; settings come as ENGRAM_*)
    foreground(settings)                    `engramctl serve`: the daemon in this terminal, its death in words

The daemon is the child so that its own pid, lock and run dir are what they always were (`daemon stop` signals the
daemon itself); the watcher only forwards SIGTERM/SIGINT/SIGHUP it receives, once, and waits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from engramctl.daemon import exits
from engramctl.daemon.rundir import RunLock
from engramctl.daemon.runner import check_host
from engramctl.errors import EngramError
from engramctl.settings import Settings, settings_env

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
LOG_TAIL_LINES = 5


def daemon_command() -> list[str]:
    return [sys.executable, "-m", "engramctl.daemon"]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment plus `extra`, this engramctl first on the path (the daemon runs the code that started it)."""
    env = {**os.environ, **(extra or {})}
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run(cmd: list[str], env: dict[str, str], **popen) -> subprocess.Popen:
    """Start `cmd` in a process group of its own (a terminal's Ctrl-C reaches it once, through us), forward the
    signals that stop it, and wait for it."""
    child = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, process_group=0, **popen)

    def forward(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        while True:
            try:
                child.wait()
                break
            except InterruptedError:
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return child


def log_tail(path: Path, offset: int, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines the daemon wrote to its log from `offset` on."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    useful = [ln.rstrip() for ln in text.splitlines() if ln.strip() and not ln.startswith("---")]
    return "\n".join(useful[-lines:])


def foreground(settings: Settings) -> int:
    """`engramctl serve`: the daemon in the foreground (its logs on this stderr); the exit status it ended with,
    or EngramError in words when it died by a signal."""
    check_host(settings)
    settings.paths.ensure()
    probe = RunLock(settings)  # "already running" is said here, as before, not by a child's log line
    probe.acquire()
    probe.release()
    exits.forget(settings.paths.run_dir)
    child = run(daemon_command(), child_env(settings_env(settings)))
    death = exits.Death.of(child.returncode)
    if death is None or death.signal in (signal.SIGTERM, signal.SIGINT):
        return child.returncode if child.returncode >= 0 else 0
    exits.record(settings.paths.run_dir, death, child.pid, "")
    raise EngramError(death.message, hint=death.hint)


def main() -> int:
    """A background daemon: the child's output goes where ours does (background.py points it at the log)."""
    from engramctl.daemon.rundir import log_file
    from engramctl.settings import load_settings

    settings = load_settings({})
    log = log_file(settings)
    try:
        offset = log.stat().st_size
    except OSError:
        offset = 0
    child = run(daemon_command(), child_env())
    death = exits.Death.of(child.returncode)
    if death is None or death.signal in (signal.SIGTERM, signal.SIGINT):
        return child.returncode if child.returncode >= 0 else 0
    tail = log_tail(log, offset)
    exits.record(settings.paths.run_dir, death, child.pid, tail)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"--- {stamp} Error: {death.message}\n--- Hint: {death.hint}", file=sys.stderr, flush=True)
    return 128 + death.signal


if __name__ == "__main__":
    sys.exit(main())
