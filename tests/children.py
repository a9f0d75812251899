"""Child processes forked from one server process that imported their heavy modules once, instead of a new
interpreter each: the store's crash children (tests/store/test_store_crash.py, ~3.5 s of CPU each for torch and the
store) and the daemons the tests start (tests/daemon/forks.py, ~6 s of a transformers daemon's ~8 s to ready).

A forked child is still a process of its own that the test signals, run as `python <script> <args>` or
`python -m <module> <args>` runs it: the script or module as __main__, the test's environment and working
directory, stdout and stderr where the test asked, the interpreter's own exit (a Traceback on stderr and exit
code 1 for an exception, atexit handlers, threads joined). Only what `import` did is done once for all.

    with Children(preload=("torch", ...)) as children:
        child = children.start(args, env, stdout=path, stderr=path, script=... or module=..., cwd=...)
        child.pid, child.poll(), child.wait(timeout), child.send_signal(sig), child.kill(): as subprocess.Popen's

The server (this module run as `python -m tests.children`) holds no thread (fork copies only the calling thread:
a lock held by another would stay held in the child), so preloads must only import: torch's thread pools start at
its first op, not at import. It says how many threads it has once ready, and the client refuses more than one.
Requests and answers are JSON lines: a request to start, answered {"pid": ...} once forked, {"exit": pid,
"code": ...} when a child ended (its exit code, negative for a signal, as subprocess's returncode)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Child:
    """A forked child, as much of subprocess.Popen as the tests use."""

    def __init__(self, server: Children, pid: int):
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server._exits.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self.server._changed:
            if not self.server._changed.wait_for(lambda: self.poll() is not None or self.server._gone, timeout):
                raise subprocess.TimeoutExpired(f"child {self.pid}", timeout)
        if self.returncode is None:
            raise RuntimeError(f"the child server exited before child {self.pid} did")
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.send_signal(sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Children:
    """The server, with `preload` imported (from `path` prepended to sys.path) and `reread` re-imported in each child
    once its environment is set (modules that read a variable as they load), started in `env` (what the preloads
    read as they load: OMP_NUM_THREADS, for one). It refuses to serve if the preloads imported one of `absent`."""

    def __init__(
        self,
        preload: tuple[str, ...],
        path: tuple[str, ...] = (),
        reread: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        absent: tuple[str, ...] = (),
    ):
        self.config = {"preload": list(preload), "path": list(path), "reread": list(reread), "absent": list(absent)}
        self.env = dict(os.environ if env is None else env)

    def __enter__(self) -> Children:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> Children:
        env = {**self.env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), self.env.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.children", json.dumps(self.config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=str(ROOT),
        )
        self._exits: dict[int, int] = {}
        self._pids: list[int] = []
        self._gone = False
        self._changed = threading.Condition()
        self._starting = threading.Lock()  # one request and its answer at a time
        ready = self._line(120)
        if ready.get("threads") != 1 or ready.get("imported"):
            self.close()
            raise RuntimeError(f"the child server is not safe to fork from, or imported what it must not: {ready}")
        threading.Thread(target=self._read, name="children", daemon=True).start()
        return self

    def close(self) -> None:
        """Stop the server; it SIGKILLs the children still running (a test that failed before it stopped its own)."""
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def start(
        self,
        args: list[str],
        env: dict[str, str],
        stdout: Path,
        stderr: Path | None = None,
        *,
        script: Path | None = None,
        module: str | None = None,
        cwd: Path | None = None,
    ) -> Child:
        """Fork a child running `script` (or `module`) with `args` in `env` and `cwd`; its stdout and stderr go to
        those paths, opened for writing by the child (a FIFO's reader sees each line as it is printed); stderr None:
        into stdout's file, as stderr=subprocess.STDOUT."""
        assert (script is None) != (module is None)
        request = {
            "script": script and str(script),
            "module": module,
            "args": [str(a) for a in args],
            "env": env,
            "cwd": str(cwd or os.getcwd()),
            "stdout": str(stdout),
            "stderr": stderr and str(stderr),
        }
        with self._starting, self._changed:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            n = len(self._pids)
            if not self._changed.wait_for(lambda: len(self._pids) > n or self._gone, 30):
                raise TimeoutError("the child server did not fork in 30 s")
            if self._gone:
                raise RuntimeError(f"the child server exited with {self.proc.wait()}")
            return Child(self, self._pids[n])

    def _line(self, timeout: float) -> dict:
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise TimeoutError(f"the child server did not answer in {timeout} s")
        line = self.proc.stdout.readline()
        assert line, f"the child server exited with {self.proc.wait()}"
        return json.loads(line)

    def _read(self) -> None:
        for line in self.proc.stdout:
            answer = json.loads(line)
            with self._changed:
                if "exit" in answer:
                    self._exits[answer["exit"]] = answer["code"]
                else:
                    self._pids.append(answer["pid"])
                self._changed.notify_all()
        with self._changed:
            self._gone = True
            self._changed.notify_all()


# -- the server ------------------------------------------------------------------------------------------------
def _serve(config: dict) -> None:
    import gc
    import importlib

    answers = os.dup(1)
    os.dup2(2, 1)  # what an import prints goes to stderr, not into the answers
    sys.path[:0] = config["path"]
    for name in config["preload"]:
        importlib.import_module(name)
    # the imports' objects out of the collector's sight: a child's collections would otherwise walk them all and,
    # touching each, copy every page they are on (they live as long as the child either way)
    gc.freeze()

    def say(answer: dict) -> None:
        os.write(answers, json.dumps(answer).encode() + b"\n")

    imported = [name for name in config["absent"] if name in sys.modules]
    say({"ready": True, "threads": len(os.listdir("/proc/self/task")), "imported": imported})
    children: dict[int, int] = {}  # pidfd -> pid
    pending = b""
    while True:
        readable = select.select([0, *children], [], [])[0]
        for fd in readable:
            if fd != 0:
                pid = children.pop(fd)
                _, status = os.waitpid(pid, 0)
                os.close(fd)
                say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
                continue
            data = os.read(0, 1 << 16)
            if not data:  # the client closed: it wants no child left behind
                for pid in children.values():
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                return
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    for fd in (answers, *children):  # the client sees the server's end, not its children's
                        os.close(fd)
                    _become(request, config["reread"])  # returns only to let the interpreter exit
                    return
                children[os.pidfd_open(pid)] = pid
                say({"pid": pid})


def _become(request: dict, reread: list[str]) -> None:
    """In the forked child: what `python <script>` or `python -m <module>` would be, given what is imported."""
    import importlib
    import runpy

    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    for name in reread:
        if name in sys.modules:
            importlib.reload(sys.modules[name])
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # a FIFO: once the test reads it
    err = out if request["stderr"] is None else os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, to in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, to)
    for fd in {null, out, err}:  # 0, 1 and 2 only, as a new interpreter has (the soak test counts a daemon's fds)
        os.close(fd)
    if request["module"]:
        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    else:
        sys.argv = [request["script"], *request["args"]]
        runpy.run_path(request["script"], run_name="__main__")


if __name__ == "__main__":
    _serve(json.loads(sys.argv[1]))
