"""Snapshot file fuzz, bounded (issue 12 item 2): the decoder (store/snapshot_file.py) and the codec
(state/codec.py from_payload) given truncated files, flipped bits, mutated headers with a recomputed
checksum, states that do not fit the model, foreign safetensors files and random bytes. Each one gets a
typed error naming what is wrong (or, for a change that means nothing, decodes to the same state),
never another exception, a hang, or an allocation beyond a small multiple of the file's own size.

The long run (>= 100,000 cases) is scripts/fuzz_snapshots.py; figures in RELIABILITY.md section 2.
The import of such files through the API is in tests/daemon/test_fuzz_api.py; the fallback of a session
whose snapshot files are damaged is the last test here.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from engramctl.errors import SnapshotCorrupt, SnapshotError, SnapshotMismatch
from engramctl.store import snapshot_file
from engramctl.store.reader import read_payload
from tests import snapshot_mutations as mut

BASE = mut.base_file()
FUZZ = settings(
    max_examples=700,
    deadline=2000,  # a hang (or a decode that reads a claimed terabyte) shows as a missed deadline
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
    derandomize=True,  # the same cases on every run: a failure reproduces
)


@FUZZ
@given(mut.damaged(BASE))
def test_a_damaged_file_gets_a_typed_error_within_its_own_size(case):
    kind, buf = case
    error, message, peak = mut.traced_outcome(buf)
    assert peak <= mut.allocation_bound(buf), (kind, peak, len(buf))
    if error == "accepted":
        # only a change that means nothing (whitespace, a metadata entry we do not read) may pass
        assert not kind.startswith(("state:", "foreign", "random", "truncated")), kind
        assert mut.same_state(buf, BASE), kind
    else:
        assert error in ("SnapshotCorrupt", "SnapshotMismatch", "UsageError"), (kind, error)
        assert "snapshot" in message, (kind, message)


_READ_DIR = Path(tempfile.mkdtemp(prefix="fuzz-read-"))


@settings(FUZZ, max_examples=300)
@given(mut.damaged(BASE))
def test_the_disk_reader_agrees_with_decode(case):
    """store/reader.py reads a file into place with its own reads: it refuses what decode refuses, with the same
    kind of error, and reads what decode accepts as the same tensors."""
    kind, buf = case
    path = _READ_DIR / "fuzzed.safetensors"
    path.write_bytes(buf)
    try:
        want = snapshot_file.decode(buf, source="fuzzed snapshot")
    except SnapshotError as e:
        with pytest.raises(type(e)):
            read_payload(path, lambda bid: _READ_DIR / bid)
        return
    try:
        got, _meta = read_payload(path, lambda bid: _READ_DIR / bid)
    except SnapshotCorrupt as e:  # a file decode takes whole may list KV blocks that are not there
        assert "kv_blocks" in want[1] or "KV block" in e.message, (kind, e.message)
        return
    finite = all(bool(torch.isfinite(t).all()) for t in want[0].values() if t.is_floating_point())
    if not finite:  # what from_payload's check_values refuses, the reader refuses as it reads
        with pytest.raises(SnapshotCorrupt, match="NaN or Inf"):
            read_payload(path, lambda bid: _READ_DIR / bid, check_values=True)
    else:
        read_payload(path, lambda bid: _READ_DIR / bid, check_values=True)
    assert got.keys() == want[0].keys(), kind
    assert all(_bytes(got[k]) == _bytes(want[0][k]) and got[k].shape == want[0][k].shape for k in got), kind


def _bytes(t) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()  # NaN != NaN: compare the bytes


def test_the_valid_file_is_accepted():
    assert mut.outcome(BASE) == ("accepted", "")


# -- regressions: each a defect the fuzz found, with the exception it raised before the fix -------------------
def _sealed(edit) -> bytes:
    header, data = mut.split(BASE)
    header = copy.deepcopy(header)
    edit(header)
    return mut.seal(header, data)


def _reencoded(edit_tensors=None, **meta) -> bytes:
    tensors, base_meta = mut.make_payload(6, 0)
    if edit_tensors:
        edit_tensors(tensors)
    return snapshot_file.encode(tensors, {**base_meta, **meta})


def _ids_out_of_vocab(t):
    t["token_ids"] = t["token_ids"].clone()
    t["token_ids"][0] = 10**6


REGRESSIONS = [  # (case, before the fix, the error now, words of its message)
    ("metadata a list", "AttributeError", SnapshotCorrupt, "__metadata__ is not an object"),
    ("tensor entry an int", "TypeError", SnapshotCorrupt, "not an entry of dtype, shape and data_offsets"),
    ("data_offsets strings", "ValueError", SnapshotCorrupt, "not two integers"),
    ("header nested 100,000 deep", "RecursionError", SnapshotCorrupt, "nests deeper"),
    ("a tensor named twice", "accepted: the first entry silently dropped", SnapshotCorrupt, "twice"),
    ("a flipped bit in 'format'", "SnapshotMismatch: not quarantined as damage", SnapshotCorrupt, "checksum"),
    ("layout nested 5,000 deep", "RecursionError", SnapshotCorrupt, "layout"),
    ("layout an integer", "TypeError", SnapshotCorrupt, "layout"),
    ("a token id outside the vocabulary", "accepted: fails later, mid-turn", SnapshotCorrupt, "vocabulary"),
    ("a header that claims terabytes", "(safetensors caught it)", SnapshotCorrupt, "the file holds"),
    ("metadata value an integer", "(safetensors caught it)", SnapshotCorrupt, "is not a string"),
    ("no __metadata__ (a plain safetensors file)", "SnapshotCorrupt", SnapshotMismatch, "not an engramctl snapshot"),
]


def _regression_file(case: str) -> bytes:
    text = json.dumps(mut.split(BASE)[0])
    flip = bytearray(BASE)
    flip[BASE.index(b"engram-snapshot")] ^= 1
    files = {
        "metadata a list": lambda: _sealed(lambda h: h.__setitem__("__metadata__", ["x"])),
        "tensor entry an int": lambda: _sealed(lambda h: h.__setitem__("token_ids", 5)),
        "data_offsets strings": lambda: _sealed(lambda h: h["token_ids"].__setitem__("data_offsets", ["x", "y"])),
        "header nested 100,000 deep": lambda: mut.seal("[" * 100_000 + "]" * 100_000, mut.split(BASE)[1]),
        "a tensor named twice": lambda: mut.seal(
            text[:-1] + ', "token_ids": ' + json.dumps(mut.split(BASE)[0]["token_ids"]) + "}", mut.split(BASE)[1]
        ),
        "a flipped bit in 'format'": lambda: bytes(flip),
        "layout nested 5,000 deep": lambda: _reencoded(layout="[" * 5000),
        "layout an integer": lambda: _reencoded(layout="5"),
        "a token id outside the vocabulary": lambda: _reencoded(_ids_out_of_vocab),
        "a header that claims terabytes": lambda: _sealed(
            lambda h: h["token_ids"].update(shape=[2**20, 2**20, 2**10], data_offsets=[0, 8 * 2**50])
        ),
        "metadata value an integer": lambda: _sealed(lambda h: h["__metadata__"].__setitem__("n_tokens", 6)),
        "no __metadata__ (a plain safetensors file)": lambda: _sealed(lambda h: h.pop("__metadata__")),
    }
    return files[case]()


@pytest.mark.parametrize("case,before,error,words", REGRESSIONS, ids=[r[0] for r in REGRESSIONS])
def test_regression(case, before, error, words):
    buf = _regression_file(case)
    with pytest.raises(error) as e:
        tensors, meta = snapshot_file.decode(buf)
        mut.from_payload(tensors, meta, mut.SPEC)
    assert words in e.value.message, e.value.message


def test_read_metadata_refuses_a_bad_header_with_a_typed_error(tmp_path):
    for case in ("metadata a list", "header nested 100,000 deep", "a tensor named twice"):
        path = tmp_path / "x.safetensors"
        path.write_bytes(_regression_file(case))
        with pytest.raises(SnapshotCorrupt, match="bad header"):
            snapshot_file.read_metadata(path)
    path.write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(SnapshotCorrupt, match="truncated"):
        snapshot_file.read_metadata(path)


# -- a session whose snapshot files are damaged re-prefills from its transcript --------------------------------
DAMAGE = {
    "truncated": lambda buf: buf[: len(buf) // 3],
    "flipped bits": lambda buf: bytes(b ^ 0x10 if i % 997 == 5 else b for i, b in enumerate(buf)),
    "header claims terabytes": lambda buf: _claim_terabytes(buf),
    "foreign safetensors": lambda buf: _foreign(),
    "random bytes": lambda buf: bytes(range(256)) * 4,
}


def _foreign() -> bytes:
    from safetensors.torch import save

    return save({"w": torch.zeros(3)}, metadata={"producer": "another program"})


def _claim_terabytes(buf: bytes) -> bytes:
    header, data = mut.split(buf)
    header["token_ids"].update(shape=[2**20, 2**20, 2**10], data_offsets=[0, 8 * 2**50])
    return mut.seal(header, data)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_session_with_damaged_files_falls_back_to_its_transcript(damage, tiny_engine, engram_home):
    from tests.helpers import chat, served_app

    with served_app(tiny_engine("transformers"), tier_ram_bytes=0) as c:  # nothing hot: a turn reads the files
        store = c.daemon.store

        def turn(text):
            r = chat(c, "s", text, max_tokens=2)
            store.flush()
            c.daemon.service.invalidate()  # as after a restart: no state in memory
            return r

        turn("one")
        turn("two")
        for s in c.post("/list_snapshots", json={"session": "s"}).json()["snapshots"]:
            path = store._files.path(s["snapshot_id"])
            path.write_bytes(DAMAGE[damage](path.read_bytes()))
        third = turn("three")
        assert not third["engram"]["resumed"], third["engram"]
        assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        msgs = c.get("/v1/sessions/s").json()["messages"]
        assert [m["content"] for m in msgs if m["role"] == "user"] == ["one", "two", "three"]
        assert turn("four")["engram"]["resumed"]  # the re-prefilled state was snapshotted and is used again


def test_every_kind_of_damage_is_a_snapshot_error():
    for damage, fn in DAMAGE.items():
        with pytest.raises(SnapshotError):
            snapshot_file.decode(fn(BASE))
