"""Names and ids: invalid ones are rejected with a typed error and nothing is touched."""

from __future__ import annotations

import hashlib

import pytest

from engramctl.errors import InvalidName
from engramctl.store.names import (
    id_from_filename,
    id_time,
    new_snapshot_id,
    snapshot_filename,
    validate_session_name,
)
from engramctl.tiers.planner import TierPlanner

BAD_NAMES = ["", ".", "..", "../x", "a/b", "a\\b", "x" * 65, "café", "a b", "nul\x00", "tab\t", "~", "*", None, 5]
GOOD_NAMES = ["a", "A-b_c.d", "x" * 64, "...", "-", "1.2.3", "chat.2025-01-01"]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_names(name):
    assert validate_session_name(name) == name


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names(name):
    with pytest.raises(InvalidName):
        validate_session_name(name)


def _fingerprint(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def test_invalid_names_touch_nothing(store, make_payload):
    good = store.snapshots.commit("ok", make_payload(10, 1), messages=[{"role": "user", "content": "x"}])
    store.flush()
    store.close()
    root = store.settings.paths.data_dir
    before = _fingerprint(root)
    hardware = store.retention.plan.hardware
    store = type(store).open(store.settings, clock=store.clock)
    TierPlanner.start(store.settings, store.retention, hardware=hardware)
    name_calls = [
        lambda n: store.snapshots.commit(n, make_payload(10, 2)),
        lambda n: store.sessions.create(n),
        lambda n: store.transcripts.append(n, [{"role": "user", "content": "y"}]),
        lambda n: store.sessions.branch(good.id, n),
        lambda n: store.sessions.branch(n, "fine-name"),
        lambda n: store.sessions.get(n),
        lambda n: store.delete_session(n),
        lambda n: store.transcripts.replace(n, []),
        lambda n: store.sessions.set_head(n, good.id),
        lambda n: store.snapshots.list(n if n is not None else ""),  # list(None) means "all sessions"
    ]
    id_calls = [
        lambda i: store.snapshots.load(i),
        lambda i: store.snapshots.delete(i),
        lambda i: store.snapshots.info(i),
        lambda i: store.snapshots.pin(i),
        lambda i: store.sessions.set_head("ok", i if i is not None else ""),  # None = "no head"
        lambda i: store.transcripts.of_snapshot(i),
    ]
    for n in BAD_NAMES + ["../../etc/passwd"]:
        for call in name_calls:
            with pytest.raises(InvalidName):
                call(n)
    for i in BAD_NAMES + ["../../etc/passwd", "0" * 31, "G" * 32, good.id.upper(), good.id + "/"]:
        for call in id_calls:
            with pytest.raises(InvalidName):
                call(i)
    with pytest.raises(InvalidName):
        store.snapshots.commit("ok", make_payload(10, 3), label="\n")
    with pytest.raises(InvalidName):
        store.snapshots.commit("ok", make_payload(10, 3), parent="../x")
    store.close()
    assert _fingerprint(root) == before


def test_ids_are_time_sortable_hex_and_monotonic():
    t = round(id_time(new_snapshot_id(0))) + 10.0  # later than any id this process made before
    ids = [new_snapshot_id(t) for _ in range(100)] + [new_snapshot_id(t - 5), new_snapshot_id(t + 1.5)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)  # even when the clock steps back
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert id_time(ids[0]) == t and id_time(ids[-1]) == t + 1.5
    assert id_from_filename(snapshot_filename(ids[0])) == ids[0]
    assert id_from_filename("../" + ids[0] + ".safetensors") is None
    with pytest.raises(InvalidName):
        snapshot_filename("../evil")
