"""After a restart the daemon loads the most recently used states into memory before their turns ask
(daemon/prefetch.py): a real daemon process on a tiny model, stopped and started again over the same data
directory, and over copies of it with smaller RAM budgets. The first turn of a prefetched session comes from RAM
and answers what the same turn restored from disk answers; a budget that holds one state prefetches the most recent
session's only; /v1/status says what was prefetched and how long the warm-up took; a turn asking for a state the
prefetch is reading waits for that read."""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from tests.backends import both_backends
from tests.daemon.conftest import start_daemon
from tests.helpers import chat

pytestmark = both_backends
MAX_TOKENS = 6


def _prefetched(h, timeout: float = 60.0) -> dict:
    """/v1/status once its prefetch is done."""
    deadline = time.monotonic() + timeout
    while True:
        status = h.get("/v1/status").json()
        if status["prefetched"]["done"]:
            return status
        assert time.monotonic() < deadline, status["prefetched"]
        time.sleep(0.05)


def _durable(h, timeout: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        snaps = h.post("/list_snapshots", json={}).json()["snapshots"]
        if all(s["durable"] for s in snaps):
            return snaps
        assert time.monotonic() < deadline, "snapshots never became durable"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def stopped_home(served, tmp_path_factory):
    """A data directory where session "old" was used, then session "new"; the daemon stopped. Returns (home,
    {session: head snapshot's bytes})."""
    home = tmp_path_factory.mktemp("prefetch-home")
    d = start_daemon(served, home)
    try:
        with d.http() as h:
            assert _prefetched(h)["prefetched"]["states"] == 0  # nothing stored yet
            chat(h, "old", "Tell me about layers.", MAX_TOKENS)
            chat(h, "old", "And the next one?", MAX_TOKENS)
            time.sleep(0.05)  # "new" is used after "old" in the index's clock
            chat(h, "new", "Something else entirely.", MAX_TOKENS)
            snaps = {s["snapshot_id"]: s for s in _durable(h)}  # /list_snapshots: "bytes" is its files' and blocks'
            heads = {s["name"]: s["head"] for s in h.get("/v1/sessions").json()["sessions"]}
    finally:
        assert d.stop() == 0
    return home, {name: snaps[sid]["bytes"] for name, sid in heads.items()}


def _restart(served, stopped_home, tmp_path, *args: str):
    home, _ = stopped_home
    copy = tmp_path / "home"
    shutil.copytree(home, copy, ignore=shutil.ignore_patterns("run", "*.log"))
    return start_daemon(served, copy, *args)


def test_a_restarted_daemons_first_turns_come_from_ram_and_answer_what_disk_does(
    served, stopped_home, tmp_path, monkeypatch
):
    from engramctl.cli.status import daemon_fields
    from engramctl.daemon.background import daemon_status
    from engramctl.settings import load_settings

    _, head_bytes = stopped_home
    d = _restart(served, stopped_home, tmp_path / "prefetch")
    try:
        with d.http() as h:
            status = _prefetched(h)
            monkeypatch.setenv("ENGRAM_HOME", str(d.home))  # `engramctl daemon status` of that daemon
            shown = dict(daemon_fields(daemon_status(load_settings({}))))
            assert shown["preload"].startswith(f"{status['prefetched']['states']} recent states in memory (")
            assert "before it was ready" in shown["warm-up"]
            p = status["prefetched"]
            assert p["states"] >= 2 and p["bytes"] >= sum(head_bytes.values()) * 0.9, p  # both heads, maybe prefixes
            assert p["loading"] == 0 and p["skipped"] == 0 and p["failed"] == 0 and p["ms"] is not None, p
            assert status["warmup_ms"] is not None and status["warmup_ms"] > 0
            warm = {name: chat(h, name, "Go on, please.", MAX_TOKENS) for name in ("new", "old")}
    finally:
        d.stop()
    for r in warm.values():
        assert r["engram"]["resumed"] and r["engram"]["tier"] == "ram", r["engram"]
        assert r["engram"]["restored_tokens"] > 0 and r["engram"]["restore_ms"] is not None

    # the same turns over the same files with no RAM tier: nothing prefetched, both restored from disk
    cold = _restart(served, stopped_home, tmp_path / "cold", "--tier-ram-bytes", "0")
    try:
        with cold.http() as h:
            p = _prefetched(h)["prefetched"]
            assert p["states"] == 0 and p["skipped"] >= 2, p
            disk = {name: chat(h, name, "Go on, please.", MAX_TOKENS) for name in ("new", "old")}
    finally:
        cold.stop()
    for name, r in disk.items():
        assert r["engram"]["tier"] == "disk", r["engram"]
        assert r["engram"]["restored_tokens"] == warm[name]["engram"]["restored_tokens"]
        assert r["choices"][0]["message"]["content"] == warm[name]["choices"][0]["message"]["content"]


def test_a_ram_budget_for_one_state_prefetches_the_most_recent_sessions(served, stopped_home, tmp_path):
    _, head_bytes = stopped_home
    assert head_bytes["new"] <= head_bytes["old"]  # "old" has two turns: it cannot fit where "new" just fits
    budget = head_bytes["new"] + (head_bytes["old"] - head_bytes["new"]) // 2
    d = _restart(served, stopped_home, tmp_path / "small", "--tier-ram-bytes", str(budget))
    try:
        with d.http() as h:
            p = _prefetched(h)["prefetched"]
            new = chat(h, "new", "Go on, please.", MAX_TOKENS)
            old = chat(h, "old", "Go on, please.", MAX_TOKENS)
    finally:
        d.stop()
    assert p["states"] >= 1 and p["skipped"] >= 1 and p["bytes"] <= budget, (p, budget)
    assert new["engram"]["tier"] == "ram" and old["engram"]["tier"] == "disk", (new["engram"], old["engram"])


def test_a_turn_asking_for_a_state_the_prefetch_is_reading_waits_for_that_read(engine):
    """In-process (tests.helpers.served_app over the same data directory twice): the restarted daemon's prefetch is
    held inside its read of the session's head; the session's next turn joins that read instead of starting its
    own, and reports the disk it waited for."""
    from engramctl.store.inflight import in_flight
    from tests.helpers import served_app
    from tests.store.slow_reads import SlowReads

    with served_app(engine) as c:
        chat(c, "s", "Tell me about layers.", MAX_TOKENS)
        assert c.daemon.store.flush(30)
    with served_app(engine) as c:
        store = c.daemon.store
        head = store.sessions.get("s").head
        reads = SlowReads(store, only=head)
        c.daemon.start()  # the warm-up, then the prefetch starts reading the head
        assert reads.started.wait(30) and c.get("/v1/status").json()["prefetched"]["done"] is False
        got: dict = {}
        turn = threading.Thread(target=lambda: got.update(r=chat(c, "s", "Go on, please.", MAX_TOKENS)))
        turn.start()
        deadline = time.monotonic() + 30
        while in_flight(store.snapshots).joined == 0:  # the turn's load waits on the prefetch's
            assert time.monotonic() < deadline and turn.is_alive()
            time.sleep(0.005)
        held_s = 0.2
        time.sleep(held_s)
        reads.release.set()
        turn.join(60)
        assert c.daemon.prefetch.wait(30)
        p = c.get("/v1/status").json()["prefetched"]
    assert reads.reads == 1, reads.reads
    e = got["r"]["engram"]
    assert e["resumed"] and e["tier"] == "disk" and e["restore_ms"] >= held_s * 1000, e
    assert p["done"] and p["states"] >= 1 and p["loading"] == 0, p
