"""KV blocks shared between snapshots (store/blocks.py), on real tiny models' states on both backends: a turn
writes only the blocks its new tokens complete plus the constant part, a branch and another conversation with
the same tokens share blocks, a load gives back the captured payload bitwise, deleting frees a block with its
last user, a damaged block fails only its users unless a hot copy rewrites it, export/import round trips."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from checks import assert_consistent

from engramctl.errors import SnapshotCorrupt
from engramctl.state.codec import from_payload, to_payload
from engramctl.store import arrays, exchange
from engramctl.store.blocks import BLOCK_TOKENS, KV_BLOCKS
from engramctl.store.files import read_payload
from engramctl.store.reconcile import verify_block
from engramctl.store.records import ReconcileReport, payload_nbytes

BACKENDS = ("transformers", "llama.cpp")
FAMILY = "granitemoehybrid"  # recurrent, attention, recurrent, recurrent: a hybrid with one attention layer
B = BLOCK_TOKENS
ONE = B + 44  # tokens: one full block, 44 more in the snapshot's own file
TWO = 2 * B + 48  # two full blocks, 48 more


@pytest.fixture(scope="module", params=BACKENDS)
def model(request):
    """(backend name, the tiny hybrid's backend) with 64-token prefill chunks."""
    if request.param == "transformers":
        zoo, load = request.getfixturevalue("zoo"), request.getfixturevalue("load_backend")
        return request.param, load(zoo.path(FAMILY), chunk_tokens=64)
    gguf, load = request.getfixturevalue("gguf_zoo"), request.getfixturevalue("load_llama")
    return request.param, load(gguf.path(FAMILY), chunk_tokens=64)


def ids_of(n: int, seed: int = 0) -> list[int]:
    return [3 + (i * 7919 + seed * 104729) % 500 for i in range(n)]


def states(backend, ids: list[int], at: list[int]) -> list[tuple[dict, dict]]:
    """Payloads (to_payload) of one conversation captured after each of `at` tokens of `ids`, each an own copy."""
    live = backend.new_live()
    out, done = [], 0
    try:
        for n in at:
            backend.prefill(live, ids[done:n])
            done = n
            tensors, meta = to_payload(backend.capture(live), backend.spec, {"stage": "test"})
            out.append(({k: arrays.copy(t) for k, t in tensors.items()}, meta))
    finally:
        backend.release(live)
    return out


def kv_bytes_per_token(spec) -> int:
    total = 0
    for layer in spec.layers:
        for ts in layer.tensors.values():
            if -1 in ts.shape:
                per = 1
                for d in ts.shape_at(1):
                    per *= d
                total += per * {"float32": 4, "float16": 2, "bfloat16": 2}[ts.dtype]
    return total


def disk(home: Path) -> tuple[int, int, int]:
    """(bytes of snapshot files, bytes of block files, block files)."""
    snaps = sum(p.stat().st_size for p in (home / "snapshots").iterdir())
    blocks = list((home / "blocks").iterdir())
    return snaps, sum(p.stat().st_size for p in blocks), len(blocks)


def same(a, b) -> bool:
    return a[0].keys() == b[0].keys() and all(arrays.equal(a[0][k], b[0][k]) for k in a[0])


def test_a_turn_writes_one_block_and_the_constant_part_and_loads_back_bitwise(model, open_store, engram_home):
    name, backend = model
    ids = ids_of(3 * B)
    first, second = states(backend, ids, [ONE, ONE + B])
    s = open_store(ram=0)  # every load below reads the disk
    r1 = s.snapshots.commit("talk", first)
    s.flush()
    snaps1, blocks1, n1 = disk(engram_home)
    assert n1 == 1
    r2 = s.snapshots.commit("talk", second)
    s.flush()
    snaps2, blocks2, n2 = disk(engram_home)
    i1, i2 = s.snapshots.info(r1.id), s.snapshots.info(r2.id)
    per_token = kv_bytes_per_token(backend.spec)
    block_file = blocks2 - blocks1
    # the second turn wrote exactly its own file and the one block its B new tokens completed
    assert n2 == 2 and snaps2 - snaps1 == i2.file_bytes
    assert per_token * B <= block_file < per_token * B + 4096
    constant = payload_nbytes(second) - per_token * 2 * B  # recurrent state, logits, ids, 44 tokens of KV
    assert i2.file_bytes < constant + 4096
    assert (snaps2 + blocks2) - (snaps1 + blocks1) <= 1.25 * (per_token * B + constant)
    # what each reports: own + shared = all of it; the first block is shared by both
    assert i2.shared_size_bytes == i1.shared_size_bytes == blocks1
    assert i2.own_size_bytes == i2.file_bytes + block_file and i1.own_size_bytes == i1.file_bytes
    assert i2.nbytes == i2.own_size_bytes + i2.shared_size_bytes
    # the session's stored bytes are what its files and blocks take on disk: the shared block once
    assert s.sessions.get("talk").stored_bytes == snaps2 + blocks2 < i1.nbytes + i2.nbytes
    s.close()
    s = open_store(ram=0)
    assert s.reconcile_report.clean
    for rec, payload in ((r1, first), (r2, second)):
        loaded, came_from = s.snapshots.load_from(rec.id)
        assert came_from == "disk" and same(loaded, payload), name
        assert KV_BLOCKS not in loaded[1]
        from_payload(*loaded, backend.spec)  # the daemon's checks pass
    assert_consistent(s)


def test_a_branch_and_another_conversation_with_the_same_tokens_share_blocks(model, open_store, engram_home):
    _, backend = model
    ids = ids_of(3 * B)
    (trunk,) = states(backend, ids, [ONE])
    (branch,) = states(backend, ids[:ONE] + ids_of(ONE, seed=1), [2 * ONE])  # the same ONE tokens, then others
    (other,) = states(backend, ids, [TWO])  # another conversation: the same tokens, prefilled in one go
    s = open_store(ram=0)
    base = s.snapshots.commit("a", trunk)
    s.flush()
    s.sessions.branch(base.id, "b")
    b = s.snapshots.commit("b", branch)
    s.flush()
    assert disk(engram_home)[2] == 2  # the branch shares block 0 and adds one of its own
    assert s.snapshots.info(b.id).shared_size_bytes == s.snapshots.info(base.id).shared_size_bytes > 0
    o = s.snapshots.commit("c", other)
    s.flush()
    assert disk(engram_home)[2] == 3  # block 0 again shared; its second block is its own tokens
    for rec, payload in ((base, trunk), (b, branch), (o, other)):
        assert same(s.snapshots.load(rec.id), payload)
    assert_consistent(s)


def test_deleting_frees_a_block_with_its_last_user(model, open_store, engram_home):
    _, backend = model
    ids = ids_of(3 * B)
    p1, p2 = states(backend, ids, [ONE, TWO])
    s = open_store(ram=0, keep_last=8)
    r1, r2 = s.snapshots.commit("a", p1), None
    s.flush()
    r2 = s.snapshots.commit("a", p2)
    s.flush()
    assert disk(engram_home)[2] == 2
    s.snapshots.delete(r1.id)  # its block stays: r2 uses it
    assert disk(engram_home)[2] == 2 and same(s.snapshots.load(r2.id), p2)
    assert s.snapshots.info(r2.id).shared_size_bytes == 0  # its own now
    s.snapshots.delete(r2.id, force=True)
    assert disk(engram_home) == (0, 0, 0)
    assert s._index.blocks() == {} and s.retention.usage()["disk"] == (0, 0)


def test_gc_and_keep_last_free_blocks(model, open_store, engram_home):
    _, backend = model
    ids = ids_of(5 * B)
    payloads = states(backend, ids, [B + 4, 2 * B + 8, 3 * B + 12, 4 * B + 16])
    s = open_store(ram=0, keep_last=2)
    for p in payloads:
        s.snapshots.commit("a", p)
        s.flush()
    kept = s.snapshots.list("a")
    assert len(kept) == 2  # the newest two: 3 and 4 blocks, the same first 3
    assert disk(engram_home)[2] == 4
    s.retention.gc()
    assert_consistent(s)


def test_a_pure_recurrent_state_has_no_blocks(zoo, load_backend, open_store, engram_home):
    backend = load_backend(zoo.path("mamba2"), chunk_tokens=64)
    (p,) = states(backend, ids_of(600), [600])
    s = open_store(ram=0)
    rec = s.snapshots.commit("m", p)
    s.flush()
    assert disk(engram_home)[2] == 0 and s.snapshots.info(rec.id).shared_size_bytes == 0
    assert same(s.snapshots.load(rec.id), p)


def test_a_damaged_block_fails_only_the_snapshots_using_it(model, open_store, engram_home):
    _, backend = model
    ids = ids_of(3 * B)
    p1, p2 = states(backend, ids, [ONE, TWO])
    (q,) = states(backend, ids_of(3 * B, seed=5), [ONE])  # another conversation: blocks of its own
    s = open_store(ram=0)
    msgs = [{"role": "user", "content": "hi"}]
    r1 = s.snapshots.commit("a", p1, messages=msgs)
    r2 = s.snapshots.commit("a", p2, messages=[{"role": "assistant", "content": "hello"}])
    rq = s.snapshots.commit("q", q, messages=msgs)
    s.flush()
    shared = s._index.block_ids_of(r1.id)[0]
    assert shared == s._index.block_ids_of(r2.id)[0] and shared not in s._index.block_ids_of(rq.id)
    s.close()
    path = engram_home / "blocks" / f"{shared}.safetensors"
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x10  # a flipped bit in the KV: the size is unchanged, only the checksum sees it
    path.write_bytes(bytes(data))
    s = open_store(ram=0)
    with pytest.raises(SnapshotCorrupt, match="checksum"):
        s.snapshots.load(r2.id)
    # both users are gone (the one never loaded too), the session resumes from its transcript
    assert {r.id for r in s.snapshots.list()} == {rq.id}
    assert s.sessions.get("a").head is None and len(s.transcripts.of_session("a")) == 2
    assert (engram_home / "quarantine" / path.name).exists()
    assert same(s.snapshots.load(rq.id), q)
    assert_consistent(s)


@pytest.mark.parametrize("hot", [True, False], ids=["a-hot-copy", "no-copy"])
def test_a_damaged_system_prompt_block_under_four_agents_is_rewritten_from_a_hot_copy(
    model, open_store, engram_home, hot
):
    """Four agents share a system prompt's block; one flipped bit in it. With one agent's state in RAM the block
    is cut again from it, checked by its id, rewritten, and no agent loses its snapshot; with no copy in memory
    every agent falls back to its transcript, as before (store/repair.py)."""
    _, backend = model
    system = ids_of(B + 20, seed=7)
    payloads = [states(backend, system + ids_of(40, seed=10 + i), [B + 60])[0] for i in range(4)]
    size = max(payload_nbytes(p) for p in payloads)
    s = open_store(ram=size + size // 2 if hot else 0)  # room for one agent's state, or none
    msgs = [{"role": "user", "content": "task"}]
    recs = [s.snapshots.commit(f"agent-{i}", p, messages=msgs) for i, p in enumerate(payloads)]
    s.flush()
    shared = s._index.block_ids_of(recs[0].id)
    assert len(shared) == 1 and all(s._index.block_ids_of(r.id) == shared for r in recs)
    in_ram = [i for i, r in enumerate(recs) if "ram" in s.snapshots.info(r.id).tiers]
    assert len(in_ram) == (1 if hot else 0)
    cold = [i for i in range(4) if i not in in_ram]
    path = engram_home / "blocks" / f"{shared[0]}.safetensors"
    good = path.read_bytes()
    data = bytearray(good)
    data[-7] ^= 0x10  # a flipped bit in the K/V: only the checksum sees it
    path.write_bytes(bytes(data))
    if hot:
        assert same(s.snapshots.load(recs[cold[0]].id), payloads[cold[0]])
        assert path.read_bytes() == good and verify_block(s._files, shared[0])[0] is not None
        assert (engram_home / "quarantine" / path.name).exists()  # the damaged bytes kept aside
        assert [r.id for r in s.snapshots.list()] == [r.id for r in recs]
        for r, p in zip(recs, payloads):
            assert same(s.snapshots.load(r.id), p)
    else:
        with pytest.raises(SnapshotCorrupt, match="checksum"):
            s.snapshots.load(recs[cold[0]].id)
        assert s.snapshots.list() == []
        for i in range(4):
            assert s.sessions.get(f"agent-{i}").head is None and len(s.transcripts.of_session(f"agent-{i}")) == 1
    assert_consistent(s)


def test_a_damaged_block_found_by_verify_and_a_missing_one_at_open(model, open_store, engram_home, caplog):
    _, backend = model
    p1, p2 = states(backend, ids_of(3 * B), [ONE, TWO])
    (q,) = states(backend, ids_of(3 * B, seed=5), [ONE])
    s = open_store(ram=0)
    r1, r2, rq = (s.snapshots.commit(n, p) for n, p in (("a", p1), ("a", p2), ("q", q)))
    s.flush()
    own_block = s._index.block_ids_of(r2.id)[1]
    q_block = s._index.block_ids_of(rq.id)[0]
    s.close()
    (engram_home / "blocks" / f"{q_block}.safetensors").unlink()  # a missing block: found at open
    path = engram_home / "blocks" / f"{own_block}.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="engramctl.store"):
        s = open_store(ram=0, verify=True)
    r = s.reconcile_report
    assert set(r.rows_dropped) == {r2.id, rq.id}
    assert "checksum" in r.rows_dropped[r2.id] and "missing" in r.rows_dropped[rq.id]
    assert path.name in r.quarantined
    # the log says what happened in a line of counts; the whole report is kept beside the quarantined files
    (line,) = [m for m in caplog.messages if m.startswith("store reconciled")]
    assert f"2 snapshots dropped; {len(r.quarantined)} files quarantined" in line and r2.id not in line
    kept = engram_home / "quarantine" / "reconcile.jsonl"
    assert str(kept) in line
    (entry,) = [json.loads(x) for x in kept.read_text().splitlines()]
    assert {k: v for k, v in entry.items() if k != "time"} == r.to_json()
    assert [p.name for p in s._core.files.quarantined()] == sorted(r.quarantined)  # not the store's own lines
    assert {x.id for x in s.snapshots.list()} == {r1.id} and s.sessions.get("a").head == r1.id
    assert same(s.snapshots.load(r1.id), p1)
    assert_consistent(s)


def test_export_writes_one_self_contained_file_and_import_shares_the_blocks_again(model, open_store, engram_home):
    _, backend = model
    (p,) = states(backend, ids_of(3 * B), [TWO])
    s = open_store(ram=0)
    msgs = [{"role": "user", "content": "hi"}]
    rec = s.snapshots.commit("a", p, messages=msgs)
    s.flush()
    whole = read_payload(engram_home / "snapshots", engram_home / "blocks", rec.id)  # as `snapshots export` reads
    buf = exchange.pack(whole, s.transcripts.of_snapshot(rec.id), "a")
    (engram_home / "blocks").rename(engram_home / "elsewhere")  # the file needs nothing else
    payload, messages, session = exchange.unpack(buf)
    (engram_home / "elsewhere").rename(engram_home / "blocks")
    assert same(payload, p) and messages == msgs and session == "a"
    assert KV_BLOCKS not in payload[1]
    blocks_before = disk(engram_home)[2]
    imported = s.snapshots.commit("imported", payload, messages=messages)
    s.flush()
    assert disk(engram_home)[2] == blocks_before  # split into the same blocks: nothing new
    assert same(s.snapshots.load(imported.id), p)
    assert s.snapshots.info(imported.id).shared_size_bytes == s.snapshots.info(rec.id).shared_size_bytes > 0


def test_store_verify_finds_a_damaged_block_and_drops_only_its_users(model, open_store, engram_home):
    _, backend = model
    p1, p2 = states(backend, ids_of(3 * B), [ONE, TWO])
    s = open_store(ram=0)
    r1, r2 = s.snapshots.commit("a", p1), s.snapshots.commit("a", p2)
    s.flush()
    second = s._index.block_ids_of(r2.id)[1]  # only r2 uses it
    path = engram_home / "blocks" / f"{second}.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x80
    path.write_bytes(bytes(data))
    bad = s.verify()
    assert set(bad) == {r2.id} and second in bad[r2.id]
    assert [x.id for x in s.snapshots.list()] == [r1.id] and s.sessions.get("a").head == r1.id
    assert same(s.snapshots.load(r1.id), p1)
    assert_consistent(s)


def test_a_reconcile_of_thousands_of_rows_is_summed_up_in_one_short_line():
    """(A store copied without its blocks drops every row: the log line stays a line.)"""
    r = ReconcileReport(
        rows_dropped={f"{i:032x}": f"KV block {i % 3:032x}: KV block file missing" for i in range(10_000)}
        | {"f" * 32: "corrupt: size 1 differs from the indexed 2 bytes"},
        blocks_removed=[f"{i:032x}" for i in range(3_002)],
    )
    line = r.summary()
    assert len(line) < 300, line
    assert line.startswith("10,001 snapshots dropped; 3,002 KV block files removed; commonest reason (3,334 dropped):")
    assert line.endswith("KV block file missing, 3 other reasons")
    assert (
        ReconcileReport(made_durable=["a"], quarantined={"x": "y"}).summary()
        == "1 file quarantined; 1 snapshot adopted"
    )
    assert ReconcileReport().summary() == "nothing to do"
