"""`snapshots ls`, `sessions` and `ps` without a daemon read the index opened read-only (listing.IndexSource): the
same rows as the store opened in full, nothing on disk changed, no lock taken, a snapshot whose files are not
complete not shown."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from engramctl.cli.listing import IndexSource, Listing, StoreSource
from engramctl.settings import load_settings
from engramctl.store.index import Index
from engramctl.store.schema import MIGRATIONS
from tests.cli.conftest import seed_store
from tests.helpers import open_planned


def _tree(root: Path) -> dict[str, str]:
    """Every file under the data dir and its content's hash, SQLite's -wal/-shm aside (a reader's connection may
    create them empty; they are SQLite's, not the store's)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(("-wal", "-shm"))
    }


@pytest.fixture
def branched():
    seeded = seed_store({"demo": 3, "other": 2}, pin=[("demo", 0)], label={("other", 1): "keep me"})
    with open_planned(load_settings())[0] as store:
        store.sessions.branch(seeded.sessions["demo"][1], "fork")
        store.sessions.branch(seeded.sessions["demo"][1], "fork2")
    return seeded


def test_rows_are_the_full_opens_rows(branched):
    """The read-only source's rows are the store's, field for field: head_of, branch_point_of, pins, labels,
    shared and own bytes, in the same order."""
    from engramctl.store.store import Store

    st = load_settings()
    with Listing(StoreSource(Store.open(st)), st.paths) as full:
        expected = full.snapshots(), full.snapshots("demo")
        sessions = full.sessions()
    with Listing(IndexSource(Index.read_only(st.paths.data_dir / "index.db")), st.paths) as read_only:
        got = read_only.snapshots(), read_only.snapshots("demo")
        assert read_only.sessions() == sessions  # nothing in memory either way: each head on disk
    assert got == expected
    tokens = {r["id"]: r["n_tokens"] for r in got[0]}
    assert {s["name"]: (s["head_tokens"], s["head_tiers"]) for s in sessions} == {
        s["name"]: (tokens[s["head"]], ["disk"]) for s in sessions
    }
    rows = {r["id"]: r for r in got[0]}
    point = rows[branched.sessions["demo"][1]]
    assert sorted(point["branch_point_of"]) == sorted(point["head_of"]) == ["fork", "fork2"]
    assert rows[branched.sessions["demo"][0]]["pinned"] is True
    assert rows[branched.sessions["other"][1]]["label"] == "keep me"
    assert [list(r) for r in got[0]] == [list(r) for r in expected[0]]  # the keys' order too: the JSON's text


def test_ls_changes_nothing_and_takes_no_lock(cli, branched, engram_home):
    st = load_settings()
    before = _tree(st.paths.data_dir)
    listed, sessions, ps = cli.json("snapshots", "ls"), cli.json("sessions"), cli.json("ps")
    assert _tree(st.paths.data_dir) == before
    assert ps["sessions"] == sessions and {s["name"] for s in sessions} == {"demo", "other", "fork", "fork2"}
    # with the store open in full elsewhere (its lock held), they still read it
    with open_planned(st)[0]:
        assert cli.json("snapshots", "ls") == listed
        assert cli.json("sessions") == sessions and cli.json("ps")["sessions"] == sessions


def test_ls_hides_a_snapshot_being_written(cli, branched):
    """A row whose files are not complete (durable=0: a write in progress, or cut short) is not listed; the
    row is left as it is for the store's next open to adopt or drop."""
    st = load_settings()
    sid = branched.sessions["other"][0]
    path = st.paths.data_dir / "index.db"
    with open_planned(st)[0] as store:
        store._index.update_snapshot(sid, durable=0)
        assert sid not in [r["id"] for r in cli.json("snapshots", "ls")]
        assert sid not in cli("snapshots", "ls", "-q", "-s", "other").stdout.split()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT durable FROM snapshots WHERE id = ?", (sid,)).fetchone() == (0,)


def test_no_store_yet_creates_nothing(cli, engram_home):
    assert cli.json("snapshots", "ls") == []
    assert not (load_settings().paths.data_dir / "index.db").exists()
    assert "no session named 'x'" in cli("snapshots", "ls", "-s", "x", code=1).stderr.lower()


def test_another_schema_is_the_full_opens_to_handle(cli, branched):
    """An index of another schema version is not read here: the full open migrates an older one and refuses a
    newer one, with its message."""
    path = load_settings().paths.data_dir / "index.db"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    assert Index.read_only(path) is None
    assert "newer engramctl" in cli("snapshots", "ls", code=1).stderr


def test_ls_leaves_the_cyclic_collector_as_it_found_it(engram_home, capsys):
    """ls turns the collector off while it lists (snapshots_ls.py) and gives it back, on or off, also when it
    fails: a test process or a Typer app calling it in-process keeps its own setting."""
    import gc

    from engramctl.cli import snapshots_ls
    from engramctl.errors import NotFound

    assert gc.isenabled()
    snapshots_ls.ls(None, True, False)
    assert gc.isenabled() and capsys.readouterr().out == "[]\n"
    with pytest.raises(NotFound):
        snapshots_ls.ls("nobody", True, False)
    assert gc.isenabled()
    gc.disable()
    try:
        snapshots_ls.ls(None, True, False)
        assert not gc.isenabled()
    finally:
        gc.enable()
