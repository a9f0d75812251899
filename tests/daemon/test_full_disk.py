"""Full disk and bad permissions (issue 12, item 6). The data dir is a small tmpfs mounted for the test
(the tests run as root here; elsewhere the tmpfs cases skip): filled to the brim by a filler file, a turn
still answers, its result says why it has no snapshot (`engram.snapshot_error`) and so does the log,
nothing partial is indexed, and snapshots resume once the filler is gone. A write that hits ENOSPC
itself (another process filled the disk between the commit and the write) is abandoned cleanly. A
read-only or foreign-owned data dir stops the daemon at start with a clear `error: ...`, no traceback."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from tests.daemon import harness


def _mount(path: Path, size: str, *options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(path)])
    if r.returncode:
        pytest.skip("cannot mount a tmpfs here")


@pytest.fixture
def tmpfs(tmp_path):
    mounts: list[Path] = []

    def mount(name: str, size: str, *options: str) -> Path:
        path = tmp_path / name
        _mount(path, size, *options)
        mounts.append(path)
        return path

    yield mount
    for m in reversed(mounts):
        subprocess.run(["umount", "-l", str(m)])


def fill(path: Path, leave: int) -> Path:
    """A filler file taking all but `leave` bytes of path's file system."""
    st = os.statvfs(path)
    filler = path / "filler.bin"
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler


def test_a_full_disk_answers_reports_and_resumes(model_dir, tmpfs, tmp_path):
    home = tmpfs("full", "24m")
    d = harness.start(model_dir, home, "--keep-last", "2", log_dir=tmp_path)
    try:
        with d.http() as h:
            harness.chat(h, "full", [{"role": "user", "content": "first turn"}])
            harness.wait_durable(h, "full")
            size = max(s["bytes"] for s in harness.snapshots(h, "full"))
            filler = fill(home, size)  # room for less than one snapshot and its margin

            r = harness.chat(h, "full", [{"role": "user", "content": "second turn, on a full disk"}])
            assert r["choices"][0]["message"]["content"] is not None  # the reply arrives
            assert r["engram"]["snapshot_id"] is None and "could not be saved" in r["engram"]["snapshot_error"]
            streamed, engram, _ = harness.stream_chat(h, "full", "third turn, streamed, still full", 6)
            assert engram["snapshot_id"] is None and engram["snapshot_error"]
            messages = harness.transcript(h, "full")  # the conversation is kept
            assert [m["content"] for m in messages][-2:] == ["third turn, streamed, still full", streamed]
            assert h.get("/v1/status").json()["write_errors"]
            view = harness.read_store(home)
            assert harness.agreement_problems(view) == [] and all(r["durable"] for r in view.rows.values())

            filler.unlink()  # space returns: the next turn is snapshotted again
            r = harness.chat(h, "full", [{"role": "user", "content": "fourth turn, room again"}])
            assert r["engram"]["snapshot_id"] and r["engram"]["snapshot_error"] is None
            harness.wait_durable(h, "full")
            again = h.post("/restore_snapshot", json={"session": "full"}).json()
            assert again["snapshot_id"] == r["engram"]["snapshot_id"]
    finally:
        d.stop()
    log = d.log_text()
    assert "could not snapshot the turn" in log and "could not be saved" in log and "Traceback" not in log


def test_enospc_in_the_write_itself_is_abandoned_cleanly(tmpfs):
    """The writer's own ENOSPC path, in process: the commit passes its room check, then the disk fills
    before the writer gets to it (held back here), and the write fails half-way."""
    import torch

    from engramctl.settings import load_settings
    from tests.helpers import open_planned

    home = tmpfs("race", "24m")
    os.environ["ENGRAM_HOME"] = str(home)  # the autouse fixture's monkeypatch restores it
    store = open_planned(load_settings({}))[0]
    try:
        payload = ({"token_ids": torch.arange(10), "x": torch.ones(300_000)}, {"fingerprint": "f", "model_id": "m"})
        kept = store.snapshots.commit("s", payload, messages=[{"role": "user", "content": "kept"}])
        store.flush()
        gate = threading.Event()
        store._writer.submit(gate.wait)  # hold the writer: the next commit waits in its queue
        lost = store.snapshots.commit("s", payload, messages=[{"role": "user", "content": "lost"}])
        filler = fill(home, 200_000)  # less than the 1.2 MB file
        gate.set()
        store.flush()
        assert [r.id for r in store.snapshots.list("s")] == [kept.id]  # dropped as a crash would drop it
        assert store.sessions.get("s").head == kept.id
        assert [m["content"] for m in store.transcripts.of_session("s")] == ["kept", "lost"]  # the transcript stays
        assert any("No space left" in e and lost.id in e for e in store.write_errors)
        view = harness.read_store(home)
        assert harness.agreement_problems(view) == [] and view.temps == []
        filler.unlink()
        again = store.snapshots.commit("s", payload)
        store.flush()
        assert store.snapshots.info(again.id).durable
    finally:
        store.close()


def _start_fails(model_dir: Path, home: Path, log_dir: Path) -> str:
    proc, log = harness.launch(model_dir, home, log_dir=log_dir)
    assert proc.wait(120) != 0
    return log.read_text()


def test_a_read_only_data_dir_is_a_clear_error_at_start(model_dir, tmpfs, tmp_path):
    home = tmpfs("ro", "1m", "ro")
    out = _start_fails(model_dir, home, tmp_path)
    assert "error: " in out and "Read-only file system" in out and "Traceback" not in out, out


def test_a_foreign_owned_data_dir_is_a_clear_error_at_start(model_dir, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    home = tmp_path / "theirs"
    home.mkdir()
    os.chown(home, 4242, 4242)
    out = _start_fails(model_dir, home, tmp_path)
    assert "error: the data directory" in out and "uid 4242" in out and "Traceback" not in out, out
