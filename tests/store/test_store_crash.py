"""Crash safety: SIGKILL during saves, then reopen; and reconcile of each kind of damage."""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest
from checks import assert_consistent

from engramctl.errors import SnapshotCorrupt
from tests.children import Children

HERE = Path(__file__).resolve().parent
CHILD = HERE / "crash_child.py"
BLOCKS_CHILD = HERE / "crash_blocks_child.py"


@pytest.fixture(scope="module")
def children():
    """The module's 28 child processes forked from one that imported torch (payloads) and the store (tests/children.py);
    the armed crash point is read as crashpoints loads, so each child reads its own."""
    preload = ("payloads", "engramctl.settings", "engramctl.store.store", "engramctl.tiers.planner")
    with Children(preload, path=(str(HERE),), reread=("engramctl.store.crashpoints",)) as c:
        yield c


def run_and_kill(children: Children, home: Path, seed: int, start: int, kill_after: int, delay_s: float) -> bool:
    """Run the child; SIGKILL it `delay_s` after it reported save number start+kill_after.
    Returns True if it was killed (False if it finished first)."""
    env = {**os.environ, "ENGRAM_HOME": str(home)}
    out, err = home.parent / f"child-{seed}.out", home.parent / f"child-{seed}.err"
    os.mkfifo(out)  # each line as the child prints it
    proc = children.start([str(seed), str(start)], env, stdout=out, stderr=err, script=CHILD)
    try:
        with open(out) as stdout:  # open until the child ended, as a pipe to a subprocess is
            for line in stdout:
                if line.strip() == str(start + kill_after):
                    time.sleep(delay_s)
                    proc.kill(signal.SIGKILL)
                    break
                if line.strip() == "done":
                    break
            proc.wait(timeout=60)
        text = err.read_text()
        assert "Traceback" not in text, text
        return proc.returncode == -signal.SIGKILL
    finally:
        if proc.returncode is None:
            proc.kill(signal.SIGKILL)
            proc.wait(timeout=60)


def test_sigkill_during_saves_then_reopen(children, open_store, engram_home):
    rng = random.Random(1234)
    killed = 0
    for round_ in range(3):
        killed += run_and_kill(
            children,
            engram_home,
            seed=round_,
            start=round_ * 50,
            kill_after=rng.randrange(5, 50),
            delay_s=rng.choice([0, 0.001, 0.005, 0.02]),
        )
        if round_ == 2:  # damage two durable files on top of the crash
            snaps = sorted((engram_home / "snapshots").glob("*.safetensors"))
            flipped, truncated = snaps[0], snaps[-1]
            data = bytearray(flipped.read_bytes())
            data[len(data) // 2] ^= 0xFF
            flipped.write_bytes(bytes(data))
            truncated.write_bytes(truncated.read_bytes()[:-100])
        store = open_store(ram="3MB", disk="40MB", keep_last=4, verify=(round_ == 2))
        report = store.reconcile_report
        assert not list((engram_home / "snapshots").glob(".*.tmp"))
        if round_ == 2:
            assert {flipped.name, truncated.name} <= set(report.quarantined)
            quarantined = {p.name for p in store._files.quarantined()}
            assert {flipped.name, truncated.name} <= quarantined
            assert flipped.name[:32] in report.rows_dropped and truncated.name[:32] in report.rows_dropped
        assert_consistent(store)  # every indexed snapshot loads and verifies; nothing dangles
        assert store.sessions.list() and store.snapshots.list()
        for s in store.sessions.list():  # transcripts never lost, even where snapshots were
            assert store.transcripts.of_session(s.name)
        store.close()
    assert killed >= 2


def test_reconcile_repairs_each_kind_of_damage(open_store, make_payload, engram_home):
    s = open_store()
    a = s.snapshots.commit("a", make_payload(10, 1)).id
    b = s.snapshots.commit("a", make_payload(11, 2)).id
    c = s.snapshots.commit("c", make_payload(12, 3)).id
    s.flush()
    s.close()
    snaps = engram_home / "snapshots"
    (snaps / f".{a}.safetensors.x1.tmp").write_bytes(b"partial")  # a write cut short
    (snaps / ("f" * 32 + ".safetensors")).write_bytes(b"orphan")  # a file with no row
    (snaps / "notes.txt").write_text("?")
    (snaps / f"{c}.safetensors").unlink()  # a row with no file
    s = open_store()
    r = s.reconcile_report
    assert r.temp_files_removed == [f".{a}.safetensors.x1.tmp"]
    assert set(r.quarantined) == {"f" * 32 + ".safetensors", "notes.txt"}
    assert r.rows_dropped == {c: "file missing"}
    assert s.sessions.get("c").head is None and s.sessions.get("a").head == b
    assert (engram_home / "quarantine" / "quarantine.jsonl").read_text().count("\n") == 2
    assert_consistent(s)


def test_unwritten_row_with_complete_file_is_adopted(open_store, make_payload, engram_home):
    s = open_store()
    rec = s.snapshots.commit("a", make_payload(10, 1))
    s.flush()
    s._index.update_snapshot(rec.id, durable=0, checksum=None)  # as if killed after rename, before the update
    s.close()
    s = open_store()
    assert s.reconcile_report.made_durable == [rec.id]
    assert s.snapshots.info(rec.id).durable and s.snapshots.info(rec.id).checksum
    assert_consistent(s)


def test_corrupt_file_found_at_load_is_quarantined(open_store, make_payload, engram_home):
    s = open_store()
    a = s.snapshots.commit("a", make_payload(10, 1), messages=[{"role": "user", "content": "hi"}]).id
    b = s.snapshots.commit("a", make_payload(10, 2)).id
    s.close()
    path = engram_home / "snapshots" / f"{b}.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 1
    path.write_bytes(bytes(data))
    s = open_store()  # size unchanged: not caught without verify
    with pytest.raises(SnapshotCorrupt, match="checksum"):
        s.snapshots.load(b)
    assert s.sessions.get("a").head == a and s.transcripts.of_session("a")
    assert (engram_home / "quarantine" / path.name).exists()
    assert_consistent(s)


def _blocks_step(children: Children, home: Path, step: str, point: str | None) -> int:
    env = {**os.environ, "ENGRAM_HOME": str(home)}
    env.pop("ENGRAM_TEST_CRASH_AT", None)
    if point:
        env["ENGRAM_TEST_CRASH_AT"] = point
    home.mkdir(parents=True, exist_ok=True)
    out, err = (home.parent / f"{step}-{point}.{kind}" for kind in ("out", "err"))
    code = children.start([step], env, stdout=out, stderr=err, script=BLOCKS_CHILD).wait(timeout=120)
    stdout, stderr = out.read_text(), err.read_text()
    assert "Traceback" not in stderr, stderr
    assert (code == 0) == ("done" in stdout), (code, stdout)
    return code


COMMIT_POINTS = (
    "commit.indexed",
    "write.encoded",
    "write.blocks_indexed",
    "write.temp_written",  # the first KV block's temp file
    "write.fsynced",
    "write.replaced",
    "write.blocks_written",
    "write.renamed",
    "write.indexed",
)
DELETE_POINTS = ("remove.unlinked", "remove.blocks_indexed")


@pytest.fixture(scope="module")
def blocks_homes(children, tmp_path_factory) -> dict[str, Path]:
    """The store each crash case starts from, built once by the same unarmed child steps: "commit" (after the
    base step) and "delete" (after base and commit). Every case copies its own: the 11 cases ran these same 13 steps
    over again."""
    homes = {}
    for step, before in (("commit", ("base",)), ("delete", ("base", "commit"))):
        home = tmp_path_factory.mktemp(f"blocks-before-{step}") / "home"
        for done in before:
            assert _blocks_step(children, home, done, None) == 0
        homes[step] = home
    return homes


@pytest.mark.parametrize("step,point", [("commit", p) for p in COMMIT_POINTS] + [("delete", p) for p in DELETE_POINTS])
def test_a_kill_at_each_step_of_a_block_commit_or_delete_leaves_no_dangling_or_leaked_block(
    step, point, children, blocks_homes, open_store, engram_home
):
    from payloads import make_payload, prefix_of, same_payload

    shutil.copytree(blocks_homes[step], engram_home, dirs_exist_ok=True)
    assert _blocks_step(children, engram_home, step, point) == -signal.SIGKILL
    s = open_store(ram=0, disk="64MB")
    assert_consistent(s)  # every snapshot's blocks are there and durable; every block file has a user
    assert not list((engram_home / "blocks").glob(".*.tmp"))
    full = make_payload(600, 7, blocks=True)
    head = s.snapshots.info(s.sessions.get("a").head)
    assert head.n_tokens in (300, 560)  # before or after the commit, never in between
    assert same_payload(s.snapshots.load(head.id), prefix_of(full, head.n_tokens, 1 if head.n_tokens == 300 else 2))
    hit = s.candidates.find(full[0]["token_ids"].tolist(), full[1]["fingerprint"], kinds=("prefix",))
    assert hit and hit[0].n_tokens in (280, 600)
    s.close()
    assert _blocks_step(children, engram_home, "delete" if step == "commit" else "commit", None) == 0  # it goes on
    s = open_store(ram=0, disk="64MB")
    assert_consistent(s)
