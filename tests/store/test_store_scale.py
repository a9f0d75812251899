"""A write's bookkeeping is O(what it writes or frees), not O(what the store holds) (issue 46, item 1), and the
edges of a write: any exception gives its disk reservation back (3e), the free-disk check counts only the bytes
a write adds (3f).

The cost is counted in SQLite's own work, not timed: the statements a commit+flush runs (set_trace_callback) and
the virtual-machine instructions they execute (set_progress_handler: a scan of every row is as many steps as there
are rows, a lookup through an index a handful). Both must be the same for a commit into a store of a few dozen
snapshots as for one into a store of several hundred."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import torch
from checks import assert_consistent

from engramctl.errors import DiskFull, NotFound
from engramctl.store.blocks import BLOCK_TOKENS as B
from engramctl.store.records import payload_nbytes
from engramctl.store.retention import FILE_SLACK_BYTES
from engramctl.tiers.planner import TierPlanner

SYSTEM = 2 * B  # the system prompt every agent shares: two full KV blocks
TURNS = 6


class SqlCost:
    """The statements and VM steps the store's connection runs from `start()` to `stop()`, both threads."""

    STEP = 10  # VM instructions per progress callback

    def __init__(self, store):
        self.db = store._index._db
        self.statements: list[str] = []
        self.steps = 0
        self.on = False
        self.db.set_trace_callback(self._trace)
        self.db.set_progress_handler(self._progress, self.STEP)

    def _trace(self, sql: str) -> None:
        if self.on:
            self.statements.append(sql)

    def _progress(self) -> int:
        if self.on:
            self.steps += self.STEP
        return 0

    def measure(self, fn) -> tuple[int, int]:
        self.statements, self.steps, self.on = [], 0, True
        try:
            fn()
        finally:
            self.on = False
        return len(self.statements), self.steps


def extend(payload, n_new: int, seed: int):
    """The next turn's state: the same tokens and K/V, `n_new` tokens more (the blocks before stay bitwise)."""
    tensors, meta = payload
    g = torch.Generator().manual_seed(seed)
    out = dict(tensors)
    ids = torch.randint(3, 500, (n_new,), generator=g)
    out["token_ids"] = torch.cat([tensors["token_ids"], ids])
    for name in ("layers.1.keys", "layers.1.values"):
        t = tensors[name]
        out[name] = torch.cat([t, torch.randn(t.shape[0], t.shape[1], n_new, t.shape[3], generator=g)], dim=2)
    out["last_logits"] = torch.randn(tensors["last_logits"].shape, generator=g)
    return out, {**meta, "n_tokens": str(len(out["token_ids"]))}


def test_a_commit_costs_the_same_sql_in_a_store_of_hundreds(open_store, make_payload, clock):
    """Agents sharing a system prompt, a new conversation each, keep-last retention deleting an old snapshot at
    every commit once a conversation is long: the SQL work per commit+flush of the 3rd conversation and of the
    60th is the same (an O(store) listing or scan would make the latter several times the former)."""
    s = open_store(keep_last=4, ram=0)
    cost = SqlCost(s)
    system = make_payload(SYSTEM, 0, blocks=True)
    per_conversation = []
    for conv in range(60):
        state = system
        costs = []
        for turn in range(TURNS):
            state = extend(state, 40, seed=conv * 100 + turn)
            clock.advance(1)
            msgs = [{"role": "user", "content": f"task {conv} turn {turn}"}]

            def commit(name=f"agent-{conv}", state=state, msgs=msgs):
                s.snapshots.commit(name, state, messages=msgs)
                s.flush()

            costs.append(cost.measure(commit))
        per_conversation.append(costs)
    assert len(s.snapshots.list()) == 60 * 4  # keep-last deleted two of each conversation's six
    for turn in range(TURNS):  # the same turn of an early and a late conversation (turns differ: new blocks)
        early = statistics.median(c[turn][1] for c in per_conversation[2:6])
        late = statistics.median(c[turn][1] for c in per_conversation[-4:])
        assert late <= early * 1.1 + 100, (turn, early, late, per_conversation[-1][turn])
        statements_early = max(c[turn][0] for c in per_conversation[2:6])
        statements_late = max(c[turn][0] for c in per_conversation[-4:])
        assert statements_late <= statements_early, (turn, statements_early, statements_late)
    assert_consistent(s, verify_loads=False)


def test_eviction_by_the_disk_budget_reads_as_far_as_it_evicts(open_store, make_payload, clock):
    """With the disk budget full, each write evicts the least recently used snapshots it needs gone, read along
    the eviction index: a conversation's writes cost the same SQL work after 25 conversations as after 10, and
    the victims are the oldest conversations' earlier snapshots (their heads stay)."""
    s = open_store(keep_last=100, ram=0)
    cost = SqlCost(s)
    system = make_payload(SYSTEM, 0, blocks=True)
    costs = []
    for conv in range(30):
        if conv == 10:  # the disk is full from here on: a daemon started with a budget of what it holds
            lowered = dataclasses.replace(s.settings, tier_disk_bytes=s.retention.usage()["disk"][0])
            TierPlanner.start(lowered, s.retention, hardware=s.retention.plan.hardware)
        states = [extend(system, 8, seed=conv)]
        for turn in range(5):  # short turns: a conversation's head is a sixth of what it wrote
            states.append(extend(states[-1], 8, seed=1000 * turn + conv))
        clock.advance(1)

        def commit(name=f"agent-{conv}", states=states):
            for state in states:
                s.snapshots.commit(name, state)
            s.flush()

        costs.append(cost.measure(commit))
    kept = [len(s.snapshots.list(f"agent-{c}")) for c in range(30)]
    assert not s.write_errors, kept
    used, _ = s.retention.usage()["disk"]
    assert used <= s.retention.plan.budget("disk")
    kept = [len(s.snapshots.list(f"agent-{c}")) for c in range(30)]
    evicted = [c for c in range(30) if kept[c] < 6]
    assert evicted and evicted == list(range(len(evicted))), kept  # the oldest conversations first
    assert all(s.sessions.get(f"agent-{c}").head for c in range(30))  # a head is never evicted
    early = statistics.median(steps for _, steps in costs[11:15])
    late = statistics.median(steps for _, steps in costs[-4:])
    assert late <= early * 1.1 + 100, (early, late)
    assert_consistent(s, verify_loads=False)


def test_a_write_failing_with_any_exception_releases_its_reservation_and_is_dropped(
    open_store, make_payload, monkeypatch
):
    s = open_store()
    first = s.snapshots.commit("a", make_payload(300, 1, blocks=True))
    s.flush()

    def broken(*a, **kw):
        raise ValueError("a bug in the encoder")

    monkeypatch.setattr(s._files, "write", broken)
    second = s.snapshots.commit("a", make_payload(400, 2, blocks=True))
    assert s.flush(timeout=30)
    assert s._core.disk_reserved == 0 and second.id not in s._core.pending
    with pytest.raises(NotFound):
        s.snapshots.info(second.id)
    assert second.id in s.write_errors[-1] and "ValueError: a bug in the encoder" in s.write_errors[-1]
    assert s.sessions.get("a").head == first.id  # as if the process had stopped before writing it
    monkeypatch.undo()
    third = s.snapshots.commit("a", make_payload(400, 3, blocks=True))
    assert s.snapshots.wait_durable(third.id, timeout=30).durable
    assert_consistent(s)


def test_the_free_disk_check_counts_the_bytes_a_write_adds(open_store, make_payload, monkeypatch):
    """A turn that continues a long conversation adds its new tokens' K/V and its constant part: the check asks
    the file system for that, not for the whole payload whose earlier blocks are on disk already."""
    s = open_store(ram=0)
    first = make_payload(8 * B, 1, blocks=True)
    first_rec = s.snapshots.commit("a", first)
    s.flush()
    second = extend(first, 64, seed=2)
    whole = payload_nbytes(second)
    kv_per_token = sum(second[0][k][0].nbytes for k in ("layers.1.keys", "layers.1.values")) // (8 * B + 64)
    adds = whole - 8 * B * kv_per_token  # its 8 full blocks are on disk: 64 tokens and the constant part are new
    assert adds < whole // 4
    free = FILE_SLACK_BYTES + (adds + whole) // 2  # room for what it adds, not for the whole payload
    monkeypatch.setattr(s._files, "free_bytes", lambda: free)
    rec = s.snapshots.commit("a", second)
    assert s.snapshots.wait_durable(rec.id, timeout=30).durable
    assert s.snapshots.new_bytes(second, second[0]["token_ids"].tolist(), first_rec.id) == adds
    # a payload that does not continue the head gets no such discount: the same free bytes refuse it
    other = make_payload(8 * B + 64, 9, blocks=True)
    with pytest.raises(DiskFull):
        s.snapshots.commit("a", other)
    assert_consistent(s)


def test_a_commit_lists_no_directory_and_keeps_no_object_per_snapshot(open_store, make_payload, clock, monkeypatch):
    """What SQL counts cannot see: a commit+flush never lists the snapshots' or blocks' directories (10,000 files at
    a home lab's scale), its fsyncs are as many in a store of hundreds as in one of a few dozen, and the process
    holds no more Python objects after 234 commits more than before them (the RAM tier full, so each commit also
    evicts a hot copy: nothing may pile up per snapshot in the store's dicts, queues or the tier)."""
    import gc
    import os
    import weakref

    s = open_store(keep_last=4, ram=2 * 2**20)
    system = make_payload(SYSTEM, 0, blocks=True)
    calls = {"list": 0, "fsync": 0}
    real = {"scandir": os.scandir, "listdir": os.listdir, "fsync": os.fsync}

    def counted(name, kind):
        def call(*a, **kw):
            calls[kind] += 1
            return real[name](*a, **kw)

        return call

    def live_objects() -> int:
        # sqlite3 keeps a weak reference per cursor and prunes them every 200 cursors: bounded, and not the store's
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o) is not weakref.ReferenceType)

    monkeypatch.setattr(os, "scandir", counted("scandir", "list"))
    monkeypatch.setattr(os, "listdir", counted("listdir", "list"))
    monkeypatch.setattr(os, "fsync", counted("fsync", "fsync"))
    fsyncs = dict.fromkeys(((conv, turn) for conv in range(60) for turn in range(TURNS)), 0)  # no object made later
    objects = []
    for conv in range(60):
        if conv in (20, 59):
            objects.append(live_objects())
        state = system
        for turn in range(TURNS):
            state = extend(state, 40, seed=conv * 100 + turn)
            clock.advance(1)
            before = calls["fsync"]
            s.snapshots.commit(f"agent-{conv}", state, messages=[{"role": "user", "content": f"{conv}/{turn}"}])
            s.flush()
            fsyncs[conv, turn] = calls["fsync"] - before
    assert calls["list"] == 0
    assert len(s.snapshots.list()) == 60 * 4
    assert s.retention.usage()["ram"][1] < 60 * 4  # the tier was full: commits evicted hot copies
    for turn in range(TURNS):
        early = [fsyncs[conv, turn] for conv in range(2, 6)]
        late = [fsyncs[conv, turn] for conv in range(56, 60)]
        assert max(late) <= min(early), (turn, early, late)
    assert objects[1] - objects[0] < 39 * TURNS // 2, objects  # one object kept a commit would be 234 more
    assert_consistent(s, verify_loads=False)
