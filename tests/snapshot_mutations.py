"""Damaged and hostile snapshot files for the fuzz tests (tests/store/test_snapshot_fuzz.py, the import
cases of tests/daemon/test_fuzz_api.py) and the long run (scripts/fuzz_snapshots.py).

Every strategy here draws a file derived from a valid one (`base`, the bytes of snapshot_file.encode):
truncated, with bits flipped anywhere, with a mutated header whose checksum is recomputed (so the
file passes its checksum and only the header checks can refuse it), re-encoded with a state that does
not fit the model (missing, extra, reshaped or retyped tensors, token ids out of the vocabulary, lying
metadata), a foreign safetensors file, or random bytes. `outcome()` runs the decoder and the codec on
one and says what they did; anything but a typed error or an accepted file is a test failure.
"""

from __future__ import annotations

import json
import struct
import sys
import tracemalloc
from pathlib import Path

import torch
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent / "store"))

from payloads import FINGERPRINT, VOCAB, make_payload  # noqa: E402

from engramctl.errors import EngramError, SnapshotError, UsageError  # noqa: E402
from engramctl.state.codec import from_payload  # noqa: E402
from engramctl.state.spec import TOKENS, LayerSpec, StateSpec, TensorSpec  # noqa: E402
from engramctl.store import snapshot_file  # noqa: E402

_F32 = "float32"
# The model payloads.make_payload's states belong to (width 1).
SPEC = StateSpec(
    model_id="test/tiny-hybrid",
    fingerprint=FINGERPRINT,
    dtype=_F32,
    vocab_size=VOCAB,
    layers=(
        LayerSpec("recurrent", {"conv": TensorSpec((1, 96, 4), _F32), "recurrent": TensorSpec((1, 4, 16, 8), _F32)}),
        LayerSpec(
            "attention", {"keys": TensorSpec((1, 2, TOKENS, 16), _F32), "values": TensorSpec((1, 2, TOKENS, 16), _F32)}
        ),
        LayerSpec("recurrent", {"conv": TensorSpec((1, 96, 4), _F32), "recurrent": TensorSpec((1, 4, 16, 8), _F32)}),
    ),
)


def base_file(n_tokens: int = 6, seed: int = 0) -> bytes:
    tensors, meta = make_payload(n_tokens, seed)
    return snapshot_file.encode(tensors, meta)


# -- the file's parts ------------------------------------------------------------------------------------------
def split(buf: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", buf[:8])
    return json.loads(buf[8 : 8 + n]), buf[8 + n :]


def seal(header: dict | str, data: bytes) -> bytes:
    """A file of this header (a dict, or raw JSON text for what a dict cannot hold: duplicate keys) and
    data, with its checksum recomputed as snapshot_file does, so only the header checks stand in the way."""
    if isinstance(header, dict):
        meta = header.get("__metadata__")
        if isinstance(meta, dict):
            meta = dict(meta)
            meta.pop("checksum", None)
            algo_header = {**header, "__metadata__": meta}
            try:
                meta["checksum"] = snapshot_file._checksum(algo_header, data)
            except (TypeError, ValueError):
                pass  # a header json cannot canonicalize: no checksum then
            header = {**header, "__metadata__": meta}
        text = json.dumps(header)
    else:
        text = header
    head = text.encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + data


# -- hostile values ---------------------------------------------------------------------------------------------
_HUGE = [2**31, 2**32, 2**40, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64, 2**64 + 1, 2**128, -1, -(2**63), 10**300]
hostile_ints = st.one_of(st.integers(-(2**16), 2**16), st.sampled_from(_HUGE), st.integers())
hostile_json = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        hostile_ints,
        st.floats(allow_nan=False),
        st.text(max_size=20),
        st.sampled_from(["F32", "I64", "F99", "", "BOOL", "C64", "U64", "float32"]),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8,
)
shapes = st.one_of(
    st.lists(hostile_ints, max_size=9),
    st.lists(st.sampled_from([0, 1, 2**20, 2**31 - 1, 2**40]), min_size=1, max_size=5),
    hostile_json,
)
_META_KEYS = ["format", "format_version", "checksum", "n_tokens", "layout", "fingerprint", "dtype", "backend"]
_META_KEYS += ["state_format", "model_id", "text", "transcript", "session"]


# -- strategies: one kind of damage each ------------------------------------------------------------------------
def truncated(base: bytes):
    return st.integers(0, len(base) - 1).map(lambda n: ("truncated", base[:n]))


def flipped(base: bytes):
    def flip(bits: list[int]) -> tuple[str, bytes]:
        out = bytearray(base)
        for b in bits:
            out[b // 8] ^= 1 << (b % 8)
        return "flipped", bytes(out)

    return st.lists(st.integers(0, len(base) * 8 - 1), min_size=1, max_size=8).map(flip)


def header_mutated(base: bytes):
    """A header field set to a hostile value, deleted, or added; the checksum recomputed."""
    header, data = split(base)
    names = sorted(k for k in header if k != "__metadata__")

    @st.composite
    def draw(draw_) -> tuple[str, bytes]:
        h = json.loads(json.dumps(header))
        kind = draw_(
            st.sampled_from(["field", "shape", "dtype", "offsets", "entry", "drop", "meta", "meta_drop", "extra"])
        )
        name = draw_(st.sampled_from(names))
        if kind == "field":
            h[name][draw_(st.sampled_from(["dtype", "shape", "data_offsets"]))] = draw_(hostile_json)
        elif kind == "shape":
            h[name]["shape"] = draw_(shapes)
            if draw_(st.booleans()) and isinstance(h[name]["shape"], list):
                # make the offsets agree with the claimed size: a file that says it holds terabytes
                size = 4
                for d in h[name]["shape"]:
                    size *= d if isinstance(d, int) else 1
                h[name]["data_offsets"] = [h[name]["data_offsets"][0], h[name]["data_offsets"][0] + size]
        elif kind == "dtype":
            h[name]["dtype"] = draw_(st.sampled_from(sorted(snapshot_file._DTYPE_BYTES) + ["F99", "f32", "", "F4"]))
        elif kind == "offsets":
            h[name]["data_offsets"] = [draw_(hostile_ints), draw_(hostile_ints)]
        elif kind == "entry":
            h[name] = draw_(hostile_json)
        elif kind == "drop":
            del h[name]
        elif kind == "meta":
            h["__metadata__"][draw_(st.sampled_from(_META_KEYS))] = draw_(hostile_json)
        elif kind == "meta_drop":
            h["__metadata__"].pop(draw_(st.sampled_from(_META_KEYS)), None)
        else:
            h[draw_(st.text(max_size=12))] = draw_(hostile_json)
        if draw_(st.booleans()):  # the metadata object itself of the wrong type, sometimes
            if draw_(st.integers(0, 9)) == 0:
                h["__metadata__"] = draw_(hostile_json)
        return f"header:{kind}", seal(h, data)

    return draw()


def header_raw(base: bytes):
    """Headers a dict cannot express: a tensor named twice, a lying length prefix, deep nesting, huge
    numbers, invalid UTF-8, a non-object."""
    header, data = split(base)
    text = json.dumps(header)
    name = sorted(k for k in header if k != "__metadata__")[0]
    entry = json.dumps(header[name])
    dup = text[:-1] + f', "{name}": {entry}}}'
    dup_meta = text[:-1] + ', "__metadata__": {}}'
    (n,) = struct.unpack("<Q", base[:8])
    choices = st.one_of(
        st.just(("raw:duplicate_tensor", seal(dup, data))),
        st.just(("raw:duplicate_metadata", seal(dup_meta, data))),
        st.integers(1, 200_000).map(lambda d: ("raw:deep", seal("[" * d + "]" * d, data))),
        st.integers(1, 50_000).map(lambda d: ("raw:deep_object", seal('{"a":' * d + "1" + "}" * d, data))),
        st.integers(4300, 20_000).map(lambda d: ("raw:huge_number", seal('{"__metadata__": ' + "9" * d + "}", data))),
        st.binary(max_size=64).map(lambda b: ("raw:bytes_header", struct.pack("<Q", len(b)) + b + data)),
        st.just(("raw:not_utf8", seal(text, data)[:8] + b"\xff\xfe" + seal(text, data)[10:])),
        st.integers(0, 2**64 - 1).map(lambda k: ("raw:length", struct.pack("<Q", k) + base[8:])),
        st.sampled_from([n - 8, n + 8, n - 1, n + 1, 0]).map(
            lambda k: ("raw:length_near", struct.pack("<Q", max(k, 0)) + base[8:])
        ),
        hostile_json.map(lambda v: ("raw:non_object", seal(json.dumps(v), data))),
    )
    return choices


def state_mismatched(n_tokens: int = 6):
    """A valid, checksummed file whose state does not fit SPEC: the codec must refuse it."""

    @st.composite
    def draw(draw_) -> tuple[str, bytes]:
        tensors, meta = make_payload(n_tokens, draw_(st.integers(0, 3)))
        kind = draw_(
            st.sampled_from(
                ["missing", "extra", "reshaped", "retyped", "ids", "n_tokens", "layout", "fingerprint", "nan"]
            )
        )
        name = draw_(st.sampled_from(sorted(tensors)))
        if kind == "missing":
            del tensors[name]
        elif kind == "extra":
            tensors[draw_(st.sampled_from(["layers.3.conv", "layers.0.keys", "x", "token_ids2"]))] = torch.zeros(2)
        elif kind == "reshaped":
            tensors[name] = tensors[name].unsqueeze(0)
        elif kind == "retyped":
            tensors[name] = (
                tensors[name].view(torch.int32) if tensors[name].element_size() == 4 else tensors[name].float()
            )
        elif kind == "ids":
            bad = draw_(st.sampled_from([-1, VOCAB, 2**40, -(2**62)]))
            tensors["token_ids"] = tensors["token_ids"].clone()
            tensors["token_ids"][draw_(st.integers(0, n_tokens - 1))] = bad
        elif kind == "n_tokens":
            meta["n_tokens"] = draw_(st.sampled_from(["-1", "0", "7", "x", "", "1e9", "9" * 5000, str(2**64)]))
        elif kind == "layout":
            meta["layout"] = draw_(st.sampled_from(["", "[", "5", "{}", "[1, 2, 3]", '["recurrent"]', "[[" * 5000]))
        elif kind == "fingerprint":
            meta["fingerprint"] = draw_(st.text(max_size=20))
        else:
            t = tensors[name]
            if t.is_floating_point():
                tensors[name] = t.clone()
                tensors[name].view(-1)[0] = float("nan")
            else:
                meta["dtype"] = "float16"
        return f"state:{kind}", snapshot_file.encode(tensors, meta)

    return draw()


def foreign():
    """A safetensors file some other program wrote (or one claiming to be ours without a checksum)."""

    @st.composite
    def draw(draw_) -> tuple[str, bytes]:
        from safetensors.torch import save

        n = draw_(st.integers(0, 4))
        tensors = {f"t{i}": torch.zeros(draw_(st.integers(0, 8)), dtype=torch.float32) for i in range(n)}
        meta = draw_(st.one_of(st.none(), st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3)))
        if draw_(st.booleans()):
            meta = {**(meta or {}), "format": "engram-snapshot", "format_version": "1"}
        return "foreign", save(tensors, metadata=meta)

    return draw()


def random_bytes():
    return st.binary(max_size=512).map(lambda b: ("random", b))


def damaged(base: bytes):
    return st.one_of(
        truncated(base),
        flipped(base),
        header_mutated(base),
        header_raw(base),
        state_mismatched(),
        foreign(),
        random_bytes(),
    )


# -- the property ---------------------------------------------------------------------------------------------
class Accepted(Exception):
    """Not an error: outcome() found a file the decoder and codec took."""


def outcome(buf: bytes, spec: StateSpec = SPEC) -> tuple[str, str]:
    """(error class name, message) for a refused file, ("accepted", "") for one decoded and fitted to
    the model. Anything but a typed error propagates: that is the defect the fuzz looks for."""
    try:
        tensors, meta = snapshot_file.decode(buf, source="fuzzed snapshot")
        from_payload(tensors, meta, spec)
    except (SnapshotError, UsageError) as e:
        if not e.message or not e.message.strip():
            raise AssertionError(f"{type(e).__name__} without a message") from e
        return type(e).__name__, e.message
    except EngramError as e:
        raise AssertionError(f"an untyped EngramError for a damaged file: {e.message}") from e
    return "accepted", ""


def traced_outcome(buf: bytes, spec: StateSpec = SPEC) -> tuple[str, str, int]:
    """outcome() and the peak of what it allocated (Python and safetensors' buffers: tracemalloc sees
    every bytes object and the tensors made from them share those buffers)."""
    tracemalloc.start()
    try:
        result = outcome(buf, spec)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return (*result, peak)


def allocation_bound(buf: bytes) -> int:
    """What decoding may allocate: a copy of the file's data and the header parsed, plus a fixed allowance."""
    return 3 * len(buf) + 2**20


def same_state(buf: bytes, base: bytes) -> bool:
    """Whether an accepted file holds what `base` holds: the same tensors and the same metadata where the
    codec reads it. Other entries (text, model_id, session, transcript, ...) are free text to the decoder;
    the import route checks the ones it uses (tests/daemon/test_security.py, test_fuzz_api.py)."""
    tensors, meta = snapshot_file.decode(buf)
    base_tensors, base_meta = snapshot_file.decode(base)
    read = ("format", "format_version", "fingerprint", "dtype", "layout", "n_tokens", "state_format")
    return (
        tensors.keys() == base_tensors.keys()
        and all(torch.equal(tensors[k], base_tensors[k]) for k in tensors)
        and all(meta.get(k) == base_meta.get(k) for k in read)
        and meta.get("backend", "transformers") == base_meta.get("backend", "transformers")
    )
