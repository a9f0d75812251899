"""`snapshots ls` from the index alone makes its rows in one query (store/listing.py `listed`): they must be, value
for value and key for key (the JSON's text), the rows the record path makes (the records of the durable snapshots,
then rows.snapshot_rows with Index.session_refs), on stores with several sessions, branches, pins,
labels that JSON escapes, shared KV blocks, prefix states (never listed) and snapshots being written (not listed)."""

from __future__ import annotations

import random

import pytest

from engramctl.cli.output import dumps_indented
from engramctl.cli.rows import snapshot_rows
from engramctl.settings import load_settings
from engramctl.store.index import Index
from engramctl.store.listing import listed
from tests.helpers import open_planned
from tests.store.payloads import make_payload, prefix_of
from tests.store.test_listing_sums import World

MODELS = (("fp-a", "org/a"), ("fp-b", "org/a"), ("fp-a", "org/b"), (None, "org/a"), ("fp-a", None), (None, None))
ODD_LABELS = ('say "hi"', "back\\slash", "two\nlines\ttab", "bell \x07 and \x1f", "café ✓ 🚀", "", " ")


def _regular(idx: Index, session: str | None) -> list[dict]:
    """The rows as the record path makes them."""
    records = idx.snapshots(session, durable_only=True)
    return snapshot_rows([r.to_json() for r in records], idx.session_refs())


def _assert_same(idx: Index, session: str | None) -> list[dict]:
    got, expected = listed(idx, session), _regular(idx, session)
    assert got == expected
    assert [list(r) for r in got] == [list(r) for r in expected]  # the keys' order
    assert [[type(v) for v in r.values()] for r in got] == [[type(v) for v in r.values()] for r in expected]
    assert dumps_indented(got) == dumps_indented(expected)
    return got


@pytest.mark.parametrize("seed", range(4))
def test_listed_is_the_record_paths_rows_over_random_writes(tmp_path, seed):
    """Random snapshots, prefix states, pending rows, shared and resized blocks and removals (test_listing_sums'
    World), with sessions whose heads and branch points several share, last used at tied times."""
    idx = Index(tmp_path / "index.db")
    world = World(idx, random.Random(seed))
    rng, kinds, rows = world.rng, set(), []
    for step in range(120):
        world.step(add=0.65)
        if step % 20 == 19:
            _sessions(idx, rng)
            for session in [None, *{r["session"] for r in _regular(idx, None)}]:
                rows += _assert_same(idx, session)
            kinds |= {r[0] for r in idx.rows("SELECT kind || durable FROM snapshots")}
    assert {"snapshot1", "snapshot0", "prefix1"} <= kinds  # listed, hidden while written, never listed
    assert any(r["shared_size_bytes"] for r in rows) and any(r["own_size_bytes"] > r["file_bytes"] for r in rows)
    assert any(len(r["head_of"]) > 1 for r in rows) and any(r["branch_point_of"] for r in rows)
    assert any(r["pinned"] for r in rows) and any(r["label"] in ODD_LABELS for r in rows)
    models = {(r["fingerprint"], r["model_id"]) for r in rows}
    assert len(models) > 2 and MODELS[0] in models
    idx.close()


def _sessions(idx: Index, rng: random.Random) -> None:
    """Sessions over the listed snapshots: heads and bases drawn (so some share one), last_used with ties (the order
    then falls to the name); pins and labels JSON must escape; one snapshot marked as being written."""
    ids = [r[0] for r in idx.rows("SELECT id FROM snapshots WHERE kind = 'snapshot' ORDER BY id")]
    if not ids:
        return
    with idx.tx():
        idx.execute("DELETE FROM sessions")
        for n in range(rng.randint(3, 9)):
            idx.insert_session(
                name=f"s{n}-{rng.choice('zab')}",
                head=rng.choice([*ids[:3], None]),
                base=rng.choice([*ids[-3:], None, None]),
                created=1.0,
                last_used=float(rng.choice((5, 6, 6))),
            )
        for sid in rng.sample(ids, k=min(len(ids), 3)):
            idx.update_snapshot(sid, pinned=rng.choice((1, 2)), label=rng.choice((*ODD_LABELS, None)))
        idx.update_snapshot(rng.choice(ids), durable=0)  # being written (or cut short): listed by neither
        # most rows by one model, some by another or with a part unknown (the listing reads the newest's once)
        for sid in ids:
            fp, model = rng.choice(MODELS) if rng.random() < 0.2 else MODELS[0]
            idx.update_snapshot(sid, fingerprint=fp, model_id=model)


def test_ls_json_prints_the_record_paths_rows(cli, engram_home):
    """A store written through its API: two conversations with KV blocks (the second shares its first blocks), a
    branch, a prefix state, a pin and escaped labels, and one snapshot being written: `snapshots ls --json` prints
    exactly the record path's rows, for every session and for each."""
    settings = load_settings()
    with open_planned(settings)[0] as store:
        first = make_payload(300, seed=1, blocks=True)
        ids = [store.snapshots.commit("demo", prefix_of(first, n, seed=n), messages=[]).id for n in (100, 200, 300)]
        other = store.snapshots.commit("other", prefix_of(first, 150, seed=9), messages=[]).id
        tensors, meta = prefix_of(first, 64, seed=5)
        store.prefixes.put(tensors, meta, tensors["token_ids"].tolist())
        store.flush()
        store.sessions.branch(ids[1], "fork")
        store.sessions.branch(ids[1], "fork2")
        store.snapshots.pin(ids[0])
        store.snapshots.label(ids[2], 'say "hi" and\\go ✓ 🚀')
        store._index.update_snapshot(ids[0], label="tab\tand \x01")  # not through label(): an index written otherwise
        store._index.update_snapshot(other, durable=0)  # a write in progress: not listed
        idx = store._index
        expected = {s: _regular(idx, s) for s in (None, "demo", "other", "fork")}
        assert idx.rows("SELECT COUNT(*) FROM snapshots WHERE kind = 'prefix'")[0][0] == 1
        assert len(expected[None]) == 3 and expected["other"] == [] and expected["fork"] == []
        assert any(r["shared_size_bytes"] for r in expected[None])
        assert expected[None][1]["head_of"] == expected[None][1]["branch_point_of"] == ("fork2", "fork")
        assert cli("snapshots", "ls", "--json").stdout == dumps_indented(expected[None]) + "\n"
        for session in ("demo", "other", "fork"):
            assert cli("snapshots", "ls", "--json", "-s", session).stdout == dumps_indented(expected[session]) + "\n"
