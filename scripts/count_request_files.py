"""How many engramctl source files the code of one streamed chat request runs in (issue 46, item 2).

    .venv/bin/python scripts/count_request_files.py [--root DIR] [--files] [--json out]

Serves the daemon's app over real HTTP from this process (tests/helpers/inprocess.py, the tests' tiny random-weight
granitemoehybrid model, CPU float32) in a temporary ENGRAM_HOME, with a trace function (sys.settrace, and
threading.settrace for every thread the daemon starts: the event loop's, the worker's, the store's writer) that
records each Python function call in a file under DIR/engramctl, with its thread and a running sequence number.
Each measured request is a streamed POST /v1/chat/completions with a session, read to its end by httpx; the store
is then flushed. Two warm-up requests (another session: two turns) come first, so a module imported on first use
is not counted as the request's. Measured: "first" (a new session's first turn: nothing to restore) and "second"
(that session's next turn: the state restored).

The window opens at the first call of the route handler (routes_openai.chat_completions: FastAPI has already validated
the body). It closes, for the counts named "to_commit", when the last call of store Snapshots.commit made during the
request returns (the reply's snapshot entered in the index; its file is written after, by the store's writer), and
for "to_durable" once the reply has streamed and store.flush() has returned (the writer's work included).
Variants of each, to find the method that gave the issue's "48 files today" at efac82d:
  all          every file with a call in the window, in any thread
  no_init      less the packages' __init__.py
  no_vocab     less __init__.py and the modules below the store (errors, settings, units, protocol, pidlock)
  request      every thread but the store's writer (engram-writer), which writes snapshot files after commit
  request_no_vocab  request less no_vocab's modules: of these, the one that gives 48 at efac82d (the second turn)
Calls made in this script's own thread (the client, the flush) are not counted. Files are named relative to
DIR. --root DIR runs another checkout's engramctl and tests (a `git worktree add` of
an older commit) with this script, so that two commits are counted by one method.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

VOCAB_MODULES = ("errors.py", "settings.py", "units.py", "protocol.py", "pidlock.py")


class Recorder:
    """Every call into a file under `root`: (sequence, file, thread name); commit returns: their sequence."""

    def __init__(self, root: Path):
        self.root = str(root / "engramctl") + os.sep
        self.calls: list[tuple[int, str, str]] = []
        self.commit_returns: list[int] = []
        self.handler_calls: list[int] = []
        self.seq = 0
        self.lock = threading.Lock()

    def _next(self) -> int:
        with self.lock:
            self.seq += 1
            return self.seq

    def trace(self, frame, event, arg):
        if event != "call":
            return None
        filename = frame.f_code.co_filename
        if not filename.startswith(self.root):
            return None
        seq = self._next()
        name = os.path.join("engramctl", filename[len(self.root) :])
        self.calls.append((seq, name, threading.current_thread().name))
        code = frame.f_code.co_name
        if code == "chat_completions" and name.endswith("routes_openai.py"):
            self.handler_calls.append(seq)
        if code == "commit" and name.endswith(os.path.join("store", "snapshots.py")):
            return self._on_commit_return
        return None

    def _on_commit_return(self, frame, event, arg):
        if event == "return":
            self.commit_returns.append(self._next())
        return self._on_commit_return


def _stream(client, session: str, content: str) -> str:
    """One streamed chat turn, read to its end; the reply's text."""
    body = {
        "model": "m",
        "session": session,
        "stream": True,
        "max_tokens": 8,
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    }
    text = []
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices", []):
                    text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


WRITER_THREAD = "engram-writer"  # store/writer.py's thread
CLIENT_THREAD = "MainThread"  # this script's: the HTTP client, and its store.flush() that closes the window


def _counts(rec: Recorder, start: int, to_commit: int, to_durable: int) -> dict:
    out = {}
    for window, end in (("to_commit", to_commit), ("to_durable", to_durable)):
        calls = [(f, t) for s, f, t in rec.calls if start <= s <= end and t != CLIENT_THREAD]
        files = {f for f, _ in calls}
        no_init = {f for f in files if not f.endswith("__init__.py")}
        no_vocab = {f for f in no_init if f not in {os.path.join("engramctl", m) for m in VOCAB_MODULES}}
        request = {f for f, t in calls if t != WRITER_THREAD}
        request_no_vocab = request & no_vocab
        out[window] = {
            "all": len(files),
            "no_init": len(no_init),
            "no_vocab": len(no_vocab),
            "request": len(request),
            "request_no_vocab": len(request_no_vocab),
            "files": sorted(files),
            "writer_only": sorted(files - request),
        }
    return out


def measure(root: Path, home: Path) -> dict:
    sys.path.insert(0, str(root))
    os.environ["ENGRAM_HOME"] = str(home)
    os.environ["ENGRAM_NO_AUTOSTART"] = "1"
    import engramctl
    from tests.conftest import ModelZoo
    from tests.helpers.inprocess import InProcessDaemon

    if not Path(engramctl.__file__).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"engramctl was imported from {engramctl.__file__}, not under {root}")
    from engramctl.engine.loading import load_engine

    model = ModelZoo(home / "zoo").path("granitemoehybrid")
    engine = load_engine(str(model), model.parent, "cpu", "float32", backend="transformers", model_id="tiny-gmh")
    rec = Recorder(root.resolve())
    threading.settrace(rec.trace)  # every thread the daemon starts from here on
    sys.settrace(rec.trace)
    results = {}
    try:
        with InProcessDaemon(engine) as d:
            import httpx

            headers = {"Authorization": f"Bearer {d.daemon.token}"}
            with httpx.Client(base_url=d.url, headers=headers, timeout=120) as client:
                _stream(client, "warm-up", "hello there")
                _stream(client, "warm-up", "and again")
                d.store.flush()
                for turn, content in (("first", "what is a state?"), ("second", "tell me more")):
                    n_calls, n_commits, n_handlers = len(rec.calls), len(rec.commit_returns), len(rec.handler_calls)
                    reply = _stream(client, "counted", content)
                    d.store.flush()
                    end = rec._next()
                    handlers = rec.handler_calls[n_handlers:]
                    commits = rec.commit_returns[n_commits:]
                    if not handlers or not commits:  # a coroutine's every resumption is a "call": the first opens
                        raise SystemExit(f"{turn}: {len(handlers)} handler calls, {len(commits)} commits seen")
                    threads = {t for s, _f, t in rec.calls[n_calls:] if s >= handlers[0]}
                    results[turn] = {
                        "reply_chars": len(reply),
                        "commits": len(commits),
                        "threads": sorted(threads),
                        **_counts(rec, handlers[0], commits[-1], end),
                    }
    finally:
        sys.settrace(None)
        threading.settrace(None)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout to run")
    ap.add_argument("--json", type=Path, help="also write the counts and file lists here")
    ap.add_argument("--files", action="store_true", help="print the file lists too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="engram-count-") as tmp:
        results = measure(args.root.resolve(), Path(tmp))
    for turn, r in results.items():
        for window in ("to_commit", "to_durable"):
            c = r[window]
            summary = {k: c[k] for k in ("all", "no_init", "no_vocab", "request", "request_no_vocab")}
            print(json.dumps({"turn": turn, "window": window, **summary, "threads": r["threads"]}), flush=True)
            if args.files:
                print("  " + "\n  ".join(c["files"]))
    if args.json:
        args.json.write_text(json.dumps({"root": str(args.root), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
