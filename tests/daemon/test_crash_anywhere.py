"""Crash at every step (issue 12, item 3), bounded: a daemon process serving the tiny model runs a random
workload (streamed and plain chats, branches, imports, snapshot and session deletes, gc) with small
budgets, so RAM eviction, keep-last retention and the disk budget act all the time; it is SIGKILLed at
a random moment or at an armed kill point (engramctl/store/crashpoints.py), then started again. After
each start: the index and the files agree, every listed snapshot verifies and restores, and every
answered turn is in its transcript. scripts/crash_anywhere.py is the long form (>= 100 kills)."""

from __future__ import annotations

import random
import time

from tests.daemon import harness

CYCLES = (None, "write.renamed", "remove.unlinked", "commit.indexed")


def test_sigkill_at_random_moments_and_at_every_kill_point_keeps_index_and_files_in_agreement(model_dir, tmp_path):
    rng = random.Random(1212)
    work = harness.Workload(rng, tmp_path / "home")
    # the random kill comes once 10 turns are answered (a count, so that a loaded machine does as much)
    results = [harness.crash_cycle(model_dir, work, rng, point, turns_first=10) for point in CYCLES]
    final = harness.start(model_dir, work.home, *harness.CRASH_ARGS)
    try:
        problems = work.check(final)
    finally:
        final.stop()
    for r in results:
        print(r)
    print("ops", work.ops, "snapshots checked", work.checked_snapshots)
    assert all(r["signal"] == -9 for r in results)
    assert not [r["problems_at_start"] for r in results if r["problems_at_start"]] and not problems, problems
    assert work.turns() >= 10 and work.checked_snapshots >= 10


def test_a_sigkill_one_second_after_a_reply_loses_no_snapshot_of_it(model_dir, tmp_path):
    home = tmp_path / "home"
    d = harness.start(model_dir, home)
    try:
        with d.http() as h:
            for k in range(3):
                harness.chat(h, "one-second", [{"role": "user", "content": f"turn {k}, tell me more"}])
            _, engram, last = harness.stream_chat(h, "one-second", "and the last one?", 8)
            listed_before = {s["id"] for s in harness.snapshots(h, "one-second")}
        time.sleep(max(0.0, 1.0 - (time.perf_counter() - last)))
        d.kill()
    finally:
        d.kill()
    d = harness.start(model_dir, home)
    try:
        with d.http() as h:
            listed = {s["id"]: s for s in harness.snapshots(h, "one-second")}
            assert listed_before <= set(listed) and all(s["durable"] for s in listed.values())
            assert harness.agreement_problems(harness.read_store(home)) == []
            r = h.post("/restore_snapshot", json={"session": "one-second"}).json()
            assert r["snapshot_id"] == engram["snapshot_id"]
            assert r["token_count"] == engram["prompt_tokens"] + engram["completion_tokens"]
    finally:
        d.stop()
    assert "Traceback" not in d.log_text()
