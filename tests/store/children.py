"""The crash tests' child processes (crash_child.py, crash_blocks_child.py), each forked from one process that
imported torch and the store once, instead of a new interpreter each: each of those paid ~3.5 s of CPU for its
imports before its first save, and test_store_crash runs 28 of them.

A forked child is still a process of its own that the test SIGKILLs (or that kills itself at its armed kill point,
store/crashpoints.py), run as `python <script> <args>` runs it: the script as __main__, the test's environment,
stdout and stderr where the test reads them, the interpreter's own exit (a Traceback on stderr and exit code 1 for an
exception, threads joined). Only what `import` did is done once for all.

    with Children() as children:
        child = children.start(script, args, env, stdout=fifo_or_file, stderr=file)
        child.pid; child.wait(timeout) -> the exit code (negative: the signal), as subprocess's returncode

The server (this file as a script) reads a JSON request a line from stdin, forks, answers {"pid": ...} at once and
{"code": ...} once the child ended. One child at a time."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


class Child:
    def __init__(self, server: Children, pid: int):
        self.server, self.pid, self.returncode = server, pid, None

    def kill(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int:
        if self.returncode is None:
            self.returncode = self.server._answer(timeout)["code"]
        return self.returncode


class Children:
    def __enter__(self):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=str(ROOT)
        )
        assert self._answer(120) == {"ready": True}
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def start(self, script: Path, args: list[str], env: dict[str, str], stdout: Path, stderr: Path) -> Child:
        """Fork a child running `script` with `args` in `env`; its stdout and stderr go to those paths (opened for
        writing by the child: a FIFO's reader sees each line as it is printed)."""
        request = {"script": str(script), "args": args, "env": env, "stdout": str(stdout), "stderr": str(stderr)}
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        return Child(self, self._answer(30)["pid"])

    def _answer(self, timeout: float) -> dict:
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise TimeoutError(f"the child server did not answer in {timeout} s")
        line = self.proc.stdout.readline()
        assert line, f"the child server exited with {self.proc.wait()}"
        return json.loads(line)


def _serve() -> None:
    import importlib
    import runpy

    sys.path.insert(0, str(HERE))
    # what the children import, imported once: torch (payloads), the store and its planner
    for name in ("payloads", "engramctl.settings", "engramctl.store.store", "engramctl.tiers.planner"):
        importlib.import_module(name)
    from engramctl.store import crashpoints

    def say(answer: dict) -> None:
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()

    say({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.environ.clear()
            os.environ.update(request["env"])
            crashpoints._ARMED = crashpoints._parse(os.environ.get(crashpoints.ENV))  # read at import
            for fd, path, mode in (
                (0, os.devnull, os.O_RDONLY),
                (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            ):
                os.dup2(os.open(path, mode), fd)
            os.dup2(
                os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1
            )  # a FIFO: once the test reads it
            sys.argv = [request["script"], *request["args"]]
            runpy.run_path(request["script"], run_name="__main__")
            sys.exit(0)  # the interpreter's exit from here on, as at the end of the script
        say({"pid": pid})
        _, status = os.waitpid(pid, 0)
        say({"code": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    _serve()
