"""What the reliability tests and scripts (crash, concurrency, soak, full disk) share: a daemon process
started with any arguments, its HTTP calls, and the checks that the index and the files agree.

Used by tests/daemon/test_crash_anywhere.py, test_concurrency.py, test_soak.py, test_full_disk.py and by
scripts/crash_anywhere.py, scripts/soak.py, scripts/durability_window.py (run from the repository root).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

# the daemon is started as conftest starts it; launch also stays harness.launch for test_full_disk
from tests import helpers
from tests.daemon.conftest import Daemon, launch, wait_ready


class Proc(Daemon):
    """A daemon process (`python -m engramctl.daemon`) on a free loopback port, with the reliability
    runs' longer timeouts (their scripts run niced beside other work) and a SIGKILL."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def http(self, timeout: float = 120.0) -> httpx.Client:
        return super().http(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout: float = 30.0) -> int:
        return super().stop(timeout=timeout)


def start(
    model: Path,
    home: Path,
    *args: str,
    timeout: float = 120.0,
    nice: int = 0,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
) -> Proc:
    """Start the daemon and wait until daemon.json says where and /health answers."""
    proc, log = launch(model, home, *args, nice=nice, env=env, log_dir=log_dir)
    url, token = wait_ready(proc, log, home, timeout)
    return Proc(proc, home, url, token, log)


def chat(h: httpx.Client, session: str | None, messages: list[dict], max_tokens: int = 8, **extra) -> dict:
    """tests.helpers.chat with the reliability runs' longer turns."""
    return helpers.chat(h, session, messages, max_tokens, **extra)


def stream_chat(h: httpx.Client, session: str, content: str, max_tokens: int = 8) -> tuple[str, dict, float]:
    """A streamed turn: (text, the trailing chunk's engram object, perf_counter at the last content piece)."""
    body = {
        "model": "default",
        "session": session,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    text, engram, last = "", {}, time.perf_counter()
    with h.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream failed: {chunk}")
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    text += piece
                    last = time.perf_counter()
            if chunk.get("engram") and not chunk["choices"]:  # the recorded turn's, after the finish
                engram = chunk["engram"]
    return text, engram, last


# -- the index and the files ---------------------------------------------------------------------------
@dataclass
class StoreView:
    """What a stopped (or killed) daemon left: index rows and snapshot files."""

    rows: dict[str, dict] = field(default_factory=dict)  # id -> row
    files: set[str] = field(default_factory=set)  # snapshot ids with a file
    temps: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)
    sessions: dict[str, dict] = field(default_factory=dict)


def read_store(data_dir: Path) -> StoreView:
    view = StoreView()
    db = sqlite3.connect(f"file:{data_dir / 'index.db'}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        view.rows = {r["id"]: dict(r) for r in db.execute("SELECT * FROM snapshots")}
        view.sessions = {r["name"]: dict(r) for r in db.execute("SELECT * FROM sessions")}
    finally:
        db.close()
    for p in (data_dir / "snapshots").iterdir():
        if p.name.endswith(".safetensors") and not p.name.startswith("."):
            view.files.add(p.name[: -len(".safetensors")])
        elif p.name.endswith(".tmp"):
            view.temps.append(p.name)
        else:
            view.others.append(p.name)
    return view


def agreement_problems(view: StoreView) -> list[str]:
    """After a start (reconciled): every durable row has its file of the indexed size, every file its row,
    no temp files, every head and parent a row."""
    problems = []
    for sid, row in view.rows.items():
        if row["durable"] and sid not in view.files:
            problems.append(f"indexed durable snapshot {sid} has no file")
    for sid in view.files - set(view.rows):
        problems.append(f"orphan file {sid}.safetensors (no index row)")
    problems += [f"temp file left: {t}" for t in view.temps]
    problems += [f"unexpected file: {o}" for o in view.others]
    for name, s in view.sessions.items():
        for ref in ("head", "base"):
            if s[ref] is not None and s[ref] not in view.rows:
                problems.append(f"session {name}'s {ref} {s[ref]} is not a snapshot")
    return problems


def transcript(h: httpx.Client, session: str) -> list[dict] | None:
    r = h.get(f"/v1/sessions/{session}")
    if r.status_code == 404:
        return None
    r.raise_for_status()
    return r.json()["messages"]


def snapshots(h: httpx.Client, session: str | None = None) -> list[dict]:
    r = h.get("/list_snapshots", params={"session": session} if session else None)
    r.raise_for_status()
    return r.json()["snapshots"]


def wait_durable(h: httpx.Client, session: str, timeout: float = 60.0, interval: float = 0.005) -> float:
    """Poll until every snapshot of `session` is durable; returns perf_counter() when it was seen so."""
    deadline = time.monotonic() + timeout
    while True:
        snaps = snapshots(h, session)
        now = time.perf_counter()
        if snaps and all(s["durable"] for s in snaps):
            return now
        if time.monotonic() > deadline:
            raise TimeoutError(f"session {session}'s snapshots were not durable in {timeout} s: {snaps}")
        time.sleep(interval)


def process_figures(pid: int, reads: int = 5, gap_s: float = 0.05) -> dict[str, int]:
    """Resident bytes, open fds and threads of a process (Linux /proc). Fds and threads are the fewest
    seen over `reads` reads `gap_s` apart: the background writer holds a snapshot file open for a moment
    after a turn returns (one fd more, and not a leak), while a leak stays in every read."""
    rss, fds, threads = 0, [], []
    for k in range(reads):
        if k:
            time.sleep(gap_s)
        status = Path(f"/proc/{pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        rss = max(rss, int(fields["VmRSS"].split()[0]) * 1024)
        fds.append(len(os.listdir(f"/proc/{pid}/fd")))
        threads.append(int(fields["Threads"]))
    return {"rss": rss, "fds": min(fds), "threads": min(threads)}


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def cpu_seconds() -> float:
    """CPU time of this process and its waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


# -- the crash workload -----------------------------------------------------------------------------
CRASH_POINTS = (
    "commit.indexed",
    "write.encoded",
    "write.temp_written",
    "write.fsynced",
    "write.replaced",
    "write.renamed",
    "write.indexed",
    "remove.unlinked",
    "branch.indexed",
    "stream.piece",
)
# Small budgets so that a short run evicts from RAM, applies keep-last and the disk budget all the time.
CRASH_ARGS = ("--keep-last", "2", "--tier-ram-bytes", "1MB", "--tier-disk-bytes", "4MB")


class Died(Exception):
    """The daemon went away in the middle of a request."""


class Workload:
    """A random single-client workload on a daemon that may be killed at any moment, and what it must
    find after each restart. `answered` keeps, per session, every (question, reply) whose answer arrived
    in full; a session whose fate a kill left unknown (killed during its delete) stops being checked."""

    def __init__(self, rng, home: Path):
        self.rng, self.home = rng, home
        self.answered: dict[str, list[tuple[str, str]]] = {}
        self.n = 0
        self.ops: dict[str, int] = {}
        self.checked_snapshots = 0

    def _name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def turns(self) -> int:
        """How many answered turns the workload still checks."""
        return sum(len(t) for t in self.answered.values())

    def run(self, d: Proc, max_ops: int = 10_000, until_turns: int | None = None) -> None:
        """Random operations until the daemon dies (or max_ops, or until `until_turns` turns are answered)."""
        with d.http(timeout=60) as h:
            for _ in range(max_ops):
                if d.proc.poll() is not None or (until_turns is not None and self.turns() >= until_turns):
                    return
                try:
                    self.step(h)
                except (httpx.TransportError, Died):
                    if d.proc.poll() is None:
                        time.sleep(0.05)
                        if d.proc.poll() is None:
                            raise
                    return

    def step(self, h: httpx.Client) -> None:
        r = self.rng.random()
        sessions = sorted(self.answered)
        if r < 0.55 or not sessions:
            op = "chat"
            pool = sessions + [f"s{i}" for i in range(4)]
            self.chat(h, self.rng.choice(pool), stream=self.rng.random() < 0.5)
        elif r < 0.65:
            op = "branch"
            new = self._name("b")
            if (
                h.post("/branch_snapshot", json={"source": self.rng.choice(sessions), "new_session": new}).status_code
                == 200
            ):
                self.answered[new] = []
        elif r < 0.73:
            op = "delete_snapshot"
            snaps = snapshots(h)
            if snaps:
                h.post("/delete_snapshot", json={"snapshot_id": self.rng.choice(snaps)["id"]})
        elif r < 0.78:
            op = "delete_session"
            name = self.rng.choice(sessions)
            self.answered.pop(name)  # from here on its fate is unknown until the answer comes
            h.delete(f"/v1/sessions/{name}")
        elif r < 0.88:
            op = "import"
            self.import_one(h)
        else:
            op = "gc"
            h.post("/gc_snapshots")
        self.ops[op] = self.ops.get(op, 0) + 1

    def chat(self, h: httpx.Client, session: str, stream: bool) -> None:
        question = f"Question {self._name('q')}: tell me about {self.rng.choice(['cats', 'ssm', 'disks', 'ram'])}."
        n = self.rng.randint(3, 10)
        if stream:
            text, engram, _ = stream_chat(h, session, question, n)
            if not engram:
                raise Died("the stream ended without its final chunk")
        else:
            r = h.post(
                "/v1/chat/completions",
                json={
                    "model": "default",
                    "session": session,
                    "messages": [{"role": "user", "content": question}],
                    "max_tokens": n,
                    "temperature": 0,
                },
            )
            if r.status_code != 200:
                raise Died(f"chat answered {r.status_code}: {r.text[:200]}")
            text = r.json()["choices"][0]["message"]["content"]
        self.answered.setdefault(session, []).append((question, text))

    def import_one(self, h: httpx.Client) -> None:
        from engramctl.store import exchange, snapshot_file

        snaps = [s for s in snapshots(h) if s["durable"]]
        if not snaps:
            return
        snap = self.rng.choice(snaps)
        try:
            payload = snapshot_file.read(self.home / "snapshots" / f"{snap['id']}.safetensors")
        except Exception:  # noqa: BLE001 - deleted by retention since it was listed
            return
        messages = h.post("/get_snapshot_transcript", json={"snapshot_id": snap["id"]})
        if messages.status_code != 200:
            return
        new = self._name("i")
        buf = exchange.pack(payload, messages.json()["messages"], snap["session"])
        r = h.post("/import_snapshot", params={"session": new}, content=buf)
        if r.status_code == 200:
            self.answered[new] = []

    def check(self, d: Proc, restore: bool = True) -> list[str]:
        """After a (re)start, before anything else: the index and the files agree, every listed snapshot
        verifies and restores, every answered turn is in its session's transcript."""
        from engramctl.store import snapshot_file

        problems = agreement_problems(read_store(self.home))
        with d.http(timeout=60) as h:
            listed = snapshots(h)
            for s in listed:
                if not s["durable"]:
                    problems.append(f"snapshot {s['id']} listed but not durable after a start")
                    continue
                try:
                    snapshot_file.read(self.home / "snapshots" / f"{s['id']}.safetensors")
                except Exception as e:  # noqa: BLE001
                    problems.append(f"snapshot {s['id']} does not verify: {e}")
                    continue
                if not restore:  # the daemon is armed at branch.indexed: the probe branch would kill it
                    continue
                probe = f"v{s['id'][-12:]}"  # restore it in a throwaway branch: heads stay as they are
                r = h.post("/branch_snapshot", json={"source": s["id"], "new_session": probe})
                rr = h.post("/restore_snapshot", json={"session": probe}) if r.status_code == 200 else r
                if rr.status_code != 200 or rr.json().get("token_count") != s["tokens"]:
                    problems.append(f"snapshot {s['id']} did not restore: {rr.status_code} {rr.text[:300]}")
                h.delete(f"/v1/sessions/{probe}")
                self.checked_snapshots += 1
            for name, turns in self.answered.items():
                messages = transcript(h, name)
                if messages is None:
                    if turns:
                        problems.append(f"session {name} with {len(turns)} answered turn(s) is gone")
                    continue
                pairs = [
                    (messages[i]["content"], messages[i + 1]["content"])
                    for i in range(len(messages) - 1)
                    if messages[i]["role"] == "user" and messages[i + 1]["role"] == "assistant"
                ]
                it = iter(pairs)
                missing = [t for t in turns if t not in it]  # answered turns, in order, as a subsequence
                if missing:
                    problems.append(f"session {name}: answered turn(s) missing from the transcript: {missing[:2]}")
        return problems


def crash_cycle(
    model: Path, work: Workload, rng, point: str | None, args=CRASH_ARGS, nice: int = 0, turns_first: int = 0
) -> dict:
    """Start the daemon (armed at `point`, or to be killed at a random moment), check what the last kill
    left, run the workload until the daemon dies. Returns what happened. A random kill's clock starts once the
    workload holds `turns_first` answered turns: what a cycle has done before it dies is counted, not timed (a
    loaded machine answers fewer turns in the same seconds)."""
    import threading

    env = {"ENGRAM_TEST_CRASH_AT": f"{point}:0.25"} if point else {}
    d = start(model, work.home, *args, nice=nice, env=env)
    problems = work.check(d, restore=point != "branch.indexed")
    delay = None
    if point is None:
        delay = rng.uniform(0.02, 1.5)
        work.run(d, until_turns=turns_first)
        threading.Timer(delay, lambda: d.proc.poll() is None and os.kill(d.pid, signal.SIGKILL)).start()
    t0 = time.perf_counter()
    work.run(d, max_ops=60 if point else 10_000)
    if d.proc.poll() is None:  # the armed point did not fire within the ops: kill at this random moment
        d.kill()
        point = f"{point} (not reached; killed after the ops)"
    d.proc.wait(30)
    left = read_store(work.home)
    return {
        "point": point or f"random {delay:.2f}s",
        "ran_s": round(time.perf_counter() - t0, 2),
        "signal": d.proc.returncode,
        "temps_left": len(left.temps),
        "undurable_rows": sum(1 for r in left.rows.values() if not r["durable"]),
        "problems_at_start": problems,
    }


# -- the soak ---------------------------------------------------------------------------------------
SOAK_ARGS = ("--keep-last", "3", "--tier-ram-bytes", "2MB", "--tier-disk-bytes", "16MB")


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def soak(d: Proc, rng, turns: int, sessions: int, samples: int = 20, say=lambda _m: None) -> dict:
    """`turns` chat turns over `sessions` sessions (switching sessions restores from RAM or disk), with a
    branch every 25 turns and a session deleted every 40; process figures sampled `samples` times."""
    names = [f"soak{k}" for k in range(sessions)]
    lat, figs, tiers = [], [], {}
    every = max(1, turns // samples)
    extra = 0
    with d.http(timeout=120) as h:
        for t in range(turns):
            name = rng.choice(names)
            t0 = time.perf_counter()
            if t % 2:
                _, engram, _ = stream_chat(h, name, f"turn {t}: more on {rng.randrange(1000)}?", rng.randint(3, 8))
            else:
                engram = chat(
                    h, name, [{"role": "user", "content": f"turn {t}: why {rng.randrange(1000)}?"}], rng.randint(3, 8)
                )["engram"]
            lat.append(time.perf_counter() - t0)
            tiers[engram["tier"] or "none"] = tiers.get(engram["tier"] or "none", 0) + 1
            if t % 25 == 24:
                extra += 1
                r = h.post("/branch_snapshot", json={"source": name, "new_session": f"soakb{extra}"})
                if r.status_code == 200:
                    names.append(f"soakb{extra}")
            if t % 40 == 39 and len(names) > sessions:
                victim = names.pop(rng.randrange(len(names)))
                h.delete(f"/v1/sessions/{victim}").raise_for_status()
            if t % every == every - 1:
                figs.append({"turn": t + 1, **process_figures(d.pid), "disk": dir_bytes(d.home / "snapshots")})
                say(f"turn {t + 1}: {figs[-1]}, p99 so far {percentile(lat, 99) * 1000:.0f} ms")
    quarter = max(1, turns // 4)
    warm = [f for f in figs if f["turn"] > turns // 4]  # after warm-up
    base, tail = warm[0], warm[-3:]

    def growth(key):
        return max(f[key] for f in tail) / base[key] - 1

    return {
        "turns": turns,
        "sessions_created": sessions + extra,
        "restore_tiers": tiers,
        "rss_growth": growth("rss"),
        # fds and threads: the most seen early after warm-up against the most seen at the end
        "fds": (max(f["fds"] for f in warm[:3]), max(f["fds"] for f in tail)),
        "threads": (max(f["threads"] for f in warm[:3]), max(f["threads"] for f in tail)),
        "rss_mb": (round(base["rss"] / 2**20, 1), round(max(f["rss"] for f in tail) / 2**20, 1)),
        "disk_max": max(f["disk"] for f in figs),
        "p50_ms": percentile(lat, 50) * 1000,
        "p99_ms_q2": percentile(lat[quarter : 2 * quarter], 99) * 1000,
        "p99_ms_q4": percentile(lat[3 * quarter :], 99) * 1000,
        "figures": figs,
    }
