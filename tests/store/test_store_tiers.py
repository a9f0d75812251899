"""Tier placement through the store: budgets hold at every moment under churn; LRU order; promotion."""

from __future__ import annotations

import random

from checks import assert_consistent
from payloads import nbytes, same_payload

from engramctl.store import snapshot_file


def instrument_budgets(store, violations: list[str]) -> None:
    """Check every hot-tier insert and every file write against the budgets, at the moment it happens."""
    placement, files = store._placement, store._files
    place, write = placement._place, files.write

    def checked_place(idx, key, value, n, stamp):
        place(idx, key, value, n, stamp)
        for t in placement.tiers:
            if t.used > t.budget:
                violations.append(f"{t.name} {t.used} > {t.budget}")

    def checked_write(sid, buf):
        on_disk = 0
        for p in files.snapshots.iterdir():
            try:
                on_disk += 0 if p.name.startswith(".") else p.stat().st_size
            except FileNotFoundError:  # deleted by the API thread meanwhile
                pass
        if on_disk + len(buf) > store.retention.plan.budget("disk"):
            violations.append(f"disk {on_disk} + {len(buf)} > {store.retention.plan.budget('disk')}")
        write(sid, buf)

    placement._place, files.write = checked_place, checked_write


def test_budgets_hold_under_churn_with_tiny_budgets(open_store, make_payload, clock):
    one = len(snapshot_file.encode(*make_payload(40, 0)))
    s = open_store(ram=int(one * 3.5), disk=int(one * 25), keep_last=3)
    violations: list[str] = []
    instrument_budgets(s, violations)
    rng = random.Random(7)
    sessions = [f"s{i}" for i in range(20)]
    committed = []
    for step in range(160):
        clock.advance(rng.random())
        name = rng.choice(sessions)
        op = rng.random()
        if op < 0.6 or not committed:
            n = rng.randint(5, 40)
            committed.append(
                s.snapshots.commit(name, make_payload(n, step), messages=[{"role": "user", "content": str(step)}]).id
            )
        elif op < 0.8:
            sid = rng.choice(committed)
            try:
                s.snapshots.load(sid)
            except Exception as e:  # evicted by retention meanwhile
                assert type(e).__name__ == "NotFound"
        elif op < 0.87:
            live = [r.id for r in s.snapshots.list()]
            if live:
                s.sessions.branch(rng.choice(live), f"b{step}")
        elif op < 0.93:
            s.retention.gc()
        else:
            victim = rng.choice(sessions + [x.name for x in s.sessions.list()])
            if any(x.name == victim for x in s.sessions.list()):
                s.delete_session(victim)
        if step % 25 == 0:
            s.flush()
    s.flush()
    s.retention.gc()
    assert not violations, violations[:5]
    assert_consistent(s)
    assert s.retention.usage()["ram"][0] <= s.retention.plan.budget("ram")
    assert not s.write_errors


def test_ram_lru_order_and_promotion_on_restore(open_store, make_payload):
    p = [make_payload(20, i) for i in range(4)]
    size = nbytes(p[0])
    s = open_store(ram=size * 3)
    ids = [s.snapshots.commit("a", x).id for x in p[:3]]
    s.flush()
    assert s._placement.lru("ram") == ids
    s.snapshots.load(ids[0])  # most recently used now
    assert s._placement.lru("ram") == [ids[1], ids[2], ids[0]]
    d = s.snapshots.commit("a", p[3]).id  # evicts the LRU one: ids[1]
    s.flush()
    assert s._placement.lru("ram") == [ids[2], ids[0], d]
    assert s.snapshots.info(ids[1]).tiers == ("disk",)
    assert same_payload(s.snapshots.load(ids[1]), p[1])  # restore from disk promotes into RAM, evicting ids[2]
    assert s.snapshots.info(ids[1]).tiers == ("ram", "disk") and s.snapshots.info(ids[2]).tiers == ("disk",)


def test_snapshot_being_written_is_never_evicted(open_store, make_payload):
    size = nbytes(make_payload(20, 0))
    s = open_store(ram=size * 2)
    gate_open = __import__("threading").Event()
    write = s._files.write
    s._files.write = lambda sid, buf: (gate_open.wait(10), write(sid, buf))
    a = s.snapshots.commit("a", make_payload(20, 1)).id
    b = s.snapshots.commit("b", make_payload(20, 2)).id
    c = s.snapshots.commit("c", make_payload(20, 3)).id  # RAM is full of unwritten snapshots: c skips RAM
    assert (
        s.snapshots.info(a).tiers == ("ram",)
        and s.snapshots.info(b).tiers == ("ram",)
        and s.snapshots.info(c).tiers == ()
    )
    assert same_payload(s.snapshots.load(c), make_payload(20, 3))  # still readable from the write queue
    gate_open.set()
    s.flush()
    assert all(s.snapshots.info(x).durable for x in (a, b, c))


def test_vram_tier_with_a_stand_in_device(open_planned, make_payload, monkeypatch, hardware_like):
    """No GPU here: pretend CUDA exists (hardware figures) and record the device moves instead of
    doing them, to check that the VRAM tier is planned, filled first, demoted to RAM and promoted."""
    import engramctl.store.core as core

    moves: list[str] = []
    monkeypatch.setattr(core, "payload_to", lambda payload, device: (moves.append(device), payload)[1])
    p = [make_payload(20, i) for i in range(3)]
    size = nbytes(p[0])
    hw = hardware_like(vram_total_bytes=8 * 2**30, vram_free_bytes=6 * 2**30, gpu="Stand-in GPU")
    s, tiers = open_planned(ram=size * 2, hardware=hw)
    assert tiers.plan.budget("vram") > 0  # default vram rule from the stand-in figures
    s._placement.set_budget("vram", size)  # room for one
    a = s.snapshots.commit("a", p[0]).id
    s.flush()  # until written, a could not be moved out of the way
    b = s.snapshots.commit("a", p[1]).id
    s.flush()
    assert s.snapshots.info(b).tiers == ("vram", "disk") and s.snapshots.info(a).tiers == ("ram", "disk")
    s.snapshots.load(a)  # restore promotes to the hottest tier; b goes down to RAM
    assert s.snapshots.info(a).tiers[0] == "vram" and s.snapshots.info(b).tiers[0] == "ram"
    assert "cuda" in moves and "cpu" in moves
    j = tiers.plan_json()
    assert j["hardware"]["gpu"] == "Stand-in GPU" and j["tiers"][0]["snapshots"] == 1


def test_replan_adds_the_vram_tier_when_cuda_shows_up_after_open(
    open_planned, make_payload, monkeypatch, hardware_like
):
    """A store opened before torch was imported sees no GPU; the replan after loading the model does,
    and the VRAM tier must then exist, not only be planned."""
    import engramctl.store.core as core

    monkeypatch.setattr(core, "payload_to", lambda payload, device: payload)
    s, tiers = open_planned()  # stand-in hardware without a GPU
    assert tiers.plan.budget("vram") == 0 and [t.name for t in s._placement.tiers] == ["ram"]
    hw = hardware_like(vram_total_bytes=8 * 2**30, vram_free_bytes=6 * 2**30, gpu="Stand-in GPU")
    tiers.replan(hardware=hw)
    assert [t.name for t in s._placement.tiers] == ["vram", "ram"]
    assert s._placement.tiers[0].budget == tiers.plan.budget("vram") > 0
    sid = s.snapshots.commit("a", make_payload(20, 0)).id
    s.flush()
    assert s.snapshots.info(sid).tiers == ("vram", "disk")
    tiers.replan(hardware=hw)  # idempotent: still one VRAM tier
    assert [t.name for t in s._placement.tiers] == ["vram", "ram"] and s.snapshots.info(sid).tiers == ("vram", "disk")


def test_the_planner_places_tables_and_the_store_keeps_within_what_is_left(open_planned, make_payload):
    """N-gram tables are claims on the tier plan (tiers/planner.py): the store's hot tiers shrink by them at
    once, a replan keeps them where they are, plan_json shows them."""
    mib = 2**20
    s, tiers = open_planned(ram=10 * mib, disk=256 * mib)
    placed = tiers.claim_tables([("layer-1", 6 * mib), ("layer-2", 6 * mib)])
    assert placed == {"layer-1": "ram", "layer-2": "disk"}  # the second no longer fits in RAM
    ram = next(t for t in s._placement.tiers if t.name == "ram")
    assert tiers.plan.budget("ram") == ram.budget == 4 * mib and tiers.plan.budget("disk") == 250 * mib
    tiers.replan(hardware=tiers.plan.hardware)
    assert tiers.plan.tier("ram").table_bytes == 6 * mib and ram.budget == 4 * mib
    assert tiers.plan_json()["tables"] == [
        {"name": "layer-1", "size_bytes": 6 * mib, "tier": "ram"},
        {"name": "layer-2", "size_bytes": 6 * mib, "tier": "disk"},
    ]
    recs = [s.snapshots.commit("a", make_payload(40, i, width=200)) for i in range(4)]  # ~1.4 MiB each
    assert sum(r.nbytes for r in recs) > 4 * mib >= s.retention.usage()["ram"][0] > 0


def test_a_sessions_head_tokens_and_tiers_are_its_heads(open_store, make_payload):
    """Sessions.get and .list say each head's tokens and tiers as snapshots.info says them (`engramctl sessions`
    lists no snapshot for them): in RAM and on disk, on disk alone once evicted, none without a head."""
    size = nbytes(make_payload(20, 0))
    s = open_store(ram=size * 2)
    for i, name in enumerate(("a", "b", "c")):  # c's commit evicts a's head from RAM
        s.snapshots.commit(name, make_payload(20 + 4 * i, i))
        s.flush()
    s.sessions.create("empty")
    listed = {x.name: x for x in s.sessions.list()}
    assert s.sessions.count() == len(listed) == 4
    seen = set()
    for name in ("a", "b", "c", "empty"):
        got = s.sessions.get(name)
        assert listed[name] == got
        if got.head is None:
            assert (got.head_tokens, got.head_tiers) == (0, ())
            continue
        head = s.snapshots.info(got.head)
        assert (got.head_tokens, got.head_tiers) == (head.n_tokens, head.tiers) and head.n_tokens > 0
        seen.add(head.tiers)
    assert seen == {("disk",), ("ram", "disk")}
