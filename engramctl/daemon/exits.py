"""How a process ended, in words: a daemon (or a peer server in a benchmark) that died by a signal says which and
what to do, never a bare exit code.

    death = Death.of(returncode)          # None: it exited by itself (0, or an error it printed)
    death.message, death.hint             # "the model's CPU code uses instructions this machine does not run ..."

A return code is a signal when subprocess says -N (the child died of signal N) or a shell says 128+N. SIGILL gets the
sentence of a CPU the build does not fit (scripts/setup.sh's smoke test rebuilds it; ENGRAM_LLAMA_CPU=portable forces
the portable build); SIGSEGV, SIGBUS and SIGKILL (most often the kernel's out-of-memory killer) their own.
The watcher (daemon/watch.py) records a background daemon's death in the run dir (last_exit.json), so that
`daemon status` and `chat` can say it after the fact.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from engramctl.engine.cpu_features import REBUILD_HINT, SIGILL_SENTENCE

_SENTENCES = {
    signal.SIGILL: (SIGILL_SENTENCE, REBUILD_HINT),
    signal.SIGSEGV: (
        "it crashed with a segmentation fault (an invalid memory access in native code)",
        "the log's last lines say where; `engramctl daemon logs` shows more",
    ),
    signal.SIGBUS: (
        "it crashed with a bus error: a memory-mapped file (the model, a table) shrank or its disk failed under it",
        "check that the model file is complete and the disk is healthy (`engramctl models`)",
    ),
    signal.SIGKILL: (
        "it was killed (SIGKILL), most often by the kernel's out-of-memory killer",
        "`dmesg | grep -i oom` says whether memory ran out; a smaller model, fewer --sequences or a smaller "
        "--tier-ram-bytes needs less",
    ),
    signal.SIGABRT: (
        "it aborted (SIGABRT): native code stopped on a failed check",
        "the log's last lines name the check; `engramctl daemon logs` shows more",
    ),
}
LAST_EXIT_FILE = "last_exit.json"


@dataclass(frozen=True)
class Death:
    """A process that died by a signal."""

    signal: int
    message: str  # "<who> died of SIGILL: <sentence>"
    hint: str

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name

    @classmethod
    def of(cls, returncode: int | None, who: str = "the daemon") -> "Death | None":
        """The death a return code means (-N from subprocess, 128+N from a shell), else None."""
        if returncode is None:
            return None
        number = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 128 + 65 else 0
        try:
            sig = signal.Signals(number)
        except ValueError:
            return None
        sentence, hint = _SENTENCES.get(sig, (f"it was ended by a signal it does not expect ({sig.name})", ""))
        if sig == signal.SIGTERM or sig == signal.SIGINT:
            sentence, hint = "it was stopped by a signal from outside", ""
        return cls(int(sig), f"{who} died of {sig.name}: {sentence}", hint)


def record(run_dir: Path, death: Death, pid: int, log_tail: str) -> None:
    """Write the death to run_dir/last_exit.json (0600, atomically) for `daemon status` and `chat` to read."""
    path = run_dir / LAST_EXIT_FILE
    tmp = path.with_suffix(".partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({**asdict(death), "signal_name": death.name, "pid": pid, "at": time.time(), "log": log_tail}, f)
    os.replace(tmp, path)


def last(run_dir: Path, since: float = 0.0) -> dict | None:
    """The recorded death, if one was recorded after `since` (a time.time())."""
    try:
        data = json.loads((run_dir / LAST_EXIT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and float(data.get("at", 0)) >= since else None


def forget(run_dir: Path) -> None:
    """A daemon that starts clears the last one's death: it is no longer news."""
    (run_dir / LAST_EXIT_FILE).unlink(missing_ok=True)
