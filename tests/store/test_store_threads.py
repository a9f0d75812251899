"""Concurrency: API threads and the writer thread at once; commits to one session serialize."""

from __future__ import annotations

import threading

from checks import assert_consistent
from payloads import same_payload


def test_concurrent_commits_and_reads(open_planned, make_payload):
    s, tiers = open_planned(ram=200_000, keep_last=100)
    s.sessions.create("shared")
    expected: dict[str, tuple] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(tag: int) -> None:
        try:
            for i in range(15):
                p = make_payload(10 + i, tag * 100 + i)
                rec = s.snapshots.commit("shared", p, messages=[{"role": "user", "content": f"{tag}-{i}"}])
                with lock:
                    expected[rec.id] = p
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader() -> None:
        try:
            while not stop.is_set():
                with lock:
                    items = list(expected.items())
                for sid, p in items[-5:]:
                    assert same_payload(s.snapshots.load(sid), p)  # whole, whichever tier or queue it is in
                s.snapshots.list("shared")
                tiers.plan_json()
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    writers = [threading.Thread(target=writer, args=(t,)) for t in range(3)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not errors, errors
    s.flush()
    recs = s.snapshots.list("shared")
    assert len(recs) == 45
    # commits serialized: one linear chain, each parent the head before it, transcript one per commit
    assert [r.parent for r in recs] == [None] + [r.id for r in recs[:-1]]
    assert [r.n_messages for r in recs] == list(range(1, 46))
    assert s.sessions.get("shared").head == recs[-1].id
    assert_consistent(s)
