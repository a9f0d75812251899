"""The KV block sums schema migration 5 keeps on each snapshot row (block_bytes, shared_block_bytes) and each block's
users: after any sequence of the index's own writes they equal what the listing computed from snapshot_blocks
before (the queries below, as index.py had them at 46881d6), and a store of schema 4 is migrated to the same."""

from __future__ import annotations

import random

import pytest

from engramctl.store.index import Index
from engramctl.store.schema import MIGRATIONS
from tests.store.checks import index_of_schema

# the record's sums as _SNAPSHOT_SELECT computed them (correlated subqueries: another snapshot uses the block)
_OLD_SELECT = """
    SELECT s.id,
        (SELECT COALESCE(SUM(b.nbytes), 0) FROM snapshot_blocks sb JOIN blocks b ON b.id = sb.block
         WHERE sb.snapshot = s.id) AS block_bytes,
        (SELECT COALESCE(SUM(b.nbytes), 0) FROM snapshot_blocks sb JOIN blocks b ON b.id = sb.block
         WHERE sb.snapshot = s.id
           AND NOT EXISTS (SELECT 1 FROM snapshot_blocks o WHERE o.block = sb.block AND o.snapshot <> s.id))
         AS own_block_bytes
    FROM snapshots s ORDER BY s.id
"""
# ... and as the listing's _LISTING did (a block's rows counted once per block)
_OLD_LISTING = """
    WITH per_block AS MATERIALIZED (
        SELECT sb.block AS block, b.nbytes AS nbytes, COUNT(*) = 1 AS own
        FROM snapshot_blocks sb JOIN blocks b ON b.id = sb.block GROUP BY sb.block)
    SELECT s.id, COALESCE(SUM(p.nbytes), 0), COALESCE(SUM(p.nbytes * p.own), 0)
    FROM snapshots s LEFT JOIN snapshot_blocks sb ON sb.snapshot = s.id LEFT JOIN per_block p ON p.block = sb.block
    GROUP BY s.id ORDER BY s.id
"""
_STORED = "SELECT id, block_bytes, block_bytes - shared_block_bytes FROM snapshots ORDER BY id"


def assert_sums_match(idx: Index) -> None:
    stored = [tuple(r) for r in idx.rows(_STORED)]
    assert stored == [tuple(r) for r in idx.rows(_OLD_SELECT)]
    assert stored == [tuple(r) for r in idx.rows(_OLD_LISTING)]
    users = idx.rows(
        "SELECT b.id, b.users, (SELECT COUNT(*) FROM snapshot_blocks sb WHERE sb.block = b.id) FROM blocks b"
    )
    assert [(r[0], r[1]) for r in users] == [(r[0], r[2]) for r in users]


def _snapshot(idx: Index, sid: str, kind: str, durable: int) -> None:
    session = "" if kind == "prefix" else f"s{sid[-1]}"
    idx.insert_snapshot(
        id=sid, session=session, n_tokens=1, nbytes=100, n_messages=0, created=1.0, last_access=1.0, kind=kind,
        durable=durable,
    )  # fmt: skip


class World:
    """Random writes through the index's own methods, as the store makes them: a snapshot's blocks are a chain (an
    earlier snapshot's blocks, then new ones), referenced once, sized when written, freed with their last user."""

    def __init__(self, idx: Index, rng: random.Random):
        self.idx, self.rng = idx, rng
        self.chains: dict[str, list[str]] = {}
        self.n = 0

    def add(self) -> None:
        rng, idx = self.rng, self.idx
        self.n += 1
        sid = f"snap{self.n:05d}"
        base = self.chains[rng.choice(sorted(self.chains))] if self.chains and rng.random() < 0.8 else []
        chain = base[: rng.randint(0, len(base))] + [f"{sid}-b{i}" for i in range(rng.randint(0, 3))]
        kind = "prefix" if rng.random() < 0.25 else "snapshot"
        _snapshot(idx, sid, kind, durable=int(rng.random() < 0.3))
        self.chains[sid] = chain
        if chain:
            idx.use_blocks(sid, chain, "fp", 16)
            if rng.random() < 0.2:  # referenced again (INSERT OR REPLACE over its own rows)
                idx.use_blocks(sid, chain, "fp", 16)
        with idx.tx():
            for bid in chain:  # written: its size known, durable
                if not idx.block(bid)["durable"]:
                    idx.update_block(bid, durable=1, nbytes=rng.choice((1000, 2000, 4096)))
            idx.update_snapshot(sid, durable=1)

    def remove(self) -> None:
        victims = self.rng.sample(sorted(self.chains), k=min(len(self.chains), self.rng.randint(1, 3)))
        with self.idx.tx():
            blocks = self.idx.block_ids_of_all(victims)
            self.idx.remove_snapshots(victims)
            self.idx.drop_unused_blocks(blocks)
        for sid in victims:
            del self.chains[sid]

    def resize(self) -> None:  # a block's size changed (rewritten): every user's sums follow
        rows = self.idx.rows("SELECT id FROM blocks ORDER BY id")
        if rows:
            self.idx.update_block(self.rng.choice(rows)["id"], nbytes=self.rng.choice((512, 3000)))

    def step(self, add: float) -> None:
        """One random write: an add (a draw below `add`, or nothing to remove yet), a removal (below 0.9) or a
        resize."""
        r = self.rng.random()
        if r < add or not self.chains:
            self.add()
        elif r < 0.9:
            self.remove()
        else:
            self.resize()


@pytest.mark.parametrize("seed", range(6))
def test_stored_sums_equal_the_old_listing_over_random_writes(tmp_path, seed):
    idx = Index(tmp_path / "index.db")
    world = World(idx, random.Random(seed))
    for step in range(160):
        world.step(add=0.6)
        if step % 8 == 0:
            assert_sums_match(idx)
    assert_sums_match(idx)
    shared = idx.one("SELECT COUNT(*) FROM snapshots WHERE shared_block_bytes > 0")[0]
    own = idx.one("SELECT COUNT(*) FROM snapshots WHERE block_bytes > shared_block_bytes")[0]
    assert shared and own  # the walk made both kinds of bytes
    while world.chains:
        world.remove()
    assert idx.rows("SELECT * FROM blocks") == [] and idx.rows("SELECT * FROM snapshot_blocks") == []
    idx.close()


def test_a_block_gaining_a_second_user_is_shared_for_both_and_losing_it_for_neither(tmp_path):
    idx = Index(tmp_path / "index.db")
    for sid, kind in (("a", "snapshot"), ("p", "prefix")):
        _snapshot(idx, sid, kind, durable=1)
    idx.use_blocks("a", ["x", "y"], "fp", 16)
    idx.update_block("x", nbytes=1000, durable=1)
    idx.update_block("y", nbytes=10, durable=1)
    assert [tuple(r) for r in idx.rows(_STORED)] == [("a", 1010, 1010), ("p", 0, 0)]
    idx.use_blocks("p", ["x"], "fp", 16)  # a prefix state shares x
    assert [tuple(r) for r in idx.rows(_STORED)] == [("a", 1010, 10), ("p", 1000, 0)]
    record = idx.snapshot("a")
    assert (record.nbytes, record.own_size_bytes, record.shared_size_bytes) == (1110, 110, 1000)
    idx.remove_snapshots(["p"])
    assert [tuple(r) for r in idx.rows(_STORED)] == [("a", 1010, 1010)]
    assert idx.snapshots()[0].shared_size_bytes == 0
    idx.close()


def test_a_store_of_schema_4_is_migrated_to_the_same_sums(tmp_path):
    path = tmp_path / "index.db"
    db = index_of_schema(path, 4)
    rng = random.Random(7)
    for n in range(40):
        kind = "prefix" if n % 5 == 0 else "snapshot"
        db.execute(
            "INSERT INTO snapshots (id, session, n_tokens, nbytes, n_messages, created, last_access, kind, durable) "
            "VALUES (?, 's', 1, 100, 0, 1, 1, ?, 1)",
            (f"s{n:03d}", kind),
        )
        for seq, b in enumerate(rng.sample(range(30), rng.randint(0, 5))):
            db.execute("INSERT OR IGNORE INTO blocks (id, n_tokens, nbytes, durable) VALUES (?, 16, ?, 1)", (b, b * 10))
            db.execute("INSERT INTO snapshot_blocks VALUES (?, ?, ?)", (f"s{n:03d}", seq, b))
    db.close()
    idx = Index(path)
    assert idx.schema_version == len(MIGRATIONS)
    both = "SELECT SUM(shared_block_bytes) > 0 AND SUM(block_bytes) > SUM(shared_block_bytes) FROM snapshots"
    assert idx.one(both)[0]  # the migration found shared and own bytes
    assert_sums_match(idx)
    idx.close()


def test_records_read_their_sums_from_the_row_and_durable_only_leaves_out_rows_being_written(tmp_path):
    """The records (what `snapshots ls` lists: tests/cli/test_ls_listing.py compares store/listing.py's rows with
    them) of every session's snapshots or one's: durable_only leaves out exactly the rows being written, whose
    blocks are not counted yet; shared blocks are summed apart from a snapshot's own."""
    idx = Index(tmp_path / "index.db")
    world = World(idx, random.Random(3))
    for _ in range(60):
        world.add() if world.rng.random() < 0.8 else world.remove()
    _snapshot(idx, "writing", "snapshot", durable=0)  # a row being written: its blocks not counted yet
    idx.use_blocks("writing", ["w0"], "fp", 16)
    idx.update_block("w0", nbytes=777)
    sessions = sorted({r["session"] for r in idx.rows("SELECT session FROM snapshots WHERE kind = 'snapshot'")})
    assert len(sessions) > 2
    for session in (None, *sessions):
        every = idx.snapshots(session)
        durable = idx.snapshots(session, durable_only=True)
        assert [r.id for r in durable] == [r.id for r in every if r.id != "writing"]
        assert durable == [r for r in every if r.id != "writing"]
    assert_sums_match(idx)
    writing = idx.snapshot("writing")
    assert (writing.nbytes, writing.own_size_bytes, writing.shared_size_bytes, writing.tiers) == (100, 100, 0, ())
    assert any(r.shared_size_bytes and r.own_size_bytes > r.file_bytes for r in idx.snapshots(None))
    idx.close()
