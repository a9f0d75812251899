"""SessionState <-> flat tensor dict + string metadata, and the checks a snapshot must pass before it
may touch a model: dtype, fingerprint, layer layout, every shape and dtype, finite values."""

from __future__ import annotations

import collections
import json
import weakref

from engramctl.errors import SnapshotCorrupt, SnapshotMismatch
from engramctl.state.layers import LAYER_KINDS
from engramctl.state.session_state import SessionState
from engramctl.state.spec import TOKENS, StateSpec
from engramctl.store import arrays
from engramctl.store.arrays import Array

TOKEN_IDS = "token_ids"
LAST_LOGITS = "last_logits"
BACKEND = "backend"  # metadata keys; a snapshot without them was written by the transformers backend
STATE_FORMAT = "state_format"


def written_by(meta: dict[str, str]) -> dict[str, str | None]:
    """Which backend, backend version, state format and dtype wrote a snapshot, from its metadata."""
    return {
        "backend": meta.get(BACKEND) or "transformers",  # files from before the key existed
        "backend_version": meta.get("backend_version") or None,
        "state_format": meta.get(STATE_FORMAT) or None,
        "dtype": meta.get("dtype") or None,
    }


def to_payload(state: SessionState, spec: StateSpec, extra: dict[str, str]) -> tuple[dict, dict[str, str]]:
    """Flatten a state for a snapshot file. Refuses a non-finite state: persisted poison is restored forever."""
    tensors: dict[str, Array] = {}
    for i, layer in enumerate(state.layers):
        for name, t in layer.tensors().items():
            tensors[f"layers.{i}.{name}"] = t
    tensors[TOKEN_IDS] = arrays.int64_like(state.last_logits, state.token_ids)
    tensors[LAST_LOGITS] = arrays.float32_flat(state.last_logits)
    _check_finite(tensors, "the state to save")
    meta = {
        **extra,
        "model_id": spec.model_id,
        "fingerprint": spec.fingerprint,
        "dtype": spec.dtype,
        BACKEND: spec.backend,
        STATE_FORMAT: spec.state_format,
        "backend_version": spec.backend_version,
        "layout": json.dumps(list(state.layout)),
        "dtypes": json.dumps({k: arrays.dtype_name(t) for k, t in sorted(tensors.items())}),
        "n_tokens": str(state.n_tokens),
        "text": state.text,
        # the dims that run over the tokens (the spec's TOKENS): the store keeps them in shared KV blocks
        "token_axes": json.dumps(token_axes(spec), separators=(",", ":")),
    }
    return tensors, meta


def token_axes(spec: StateSpec) -> dict[str, int]:
    """{payload tensor name: its token axis} for every tensor of `spec` that grows with the tokens."""
    return {
        f"layers.{i}.{name}": ts.shape.index(TOKENS)
        for i, layer in enumerate(spec.layers)
        for name, ts in layer.tensors.items()
        if TOKENS in ts.shape
    }


def _check_finite(tensors: dict[str, Array], what: str) -> None:
    for name, t in tensors.items():
        if arrays.is_floating(t) and not arrays.all_finite(t):
            raise SnapshotCorrupt(f"{what} holds NaN or Inf values in {name}; refusing it.")


def _layout(text: str) -> tuple:
    """The layer kinds a snapshot's metadata records; SnapshotCorrupt when it is not a JSON list of strings."""
    try:
        kinds = json.loads(text)
    except (ValueError, RecursionError):
        kinds = None
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise SnapshotCorrupt("snapshot metadata 'layout' is not a JSON list of layer kinds.")
    return tuple(kinds)


def from_payload(
    tensors: dict[str, Array],
    meta: dict[str, str],
    spec: StateSpec,
    *,
    check_values: bool = True,
    checked: Checked | None = None,
) -> SessionState:
    """Rebuild a SessionState, raising SnapshotMismatch/SnapshotCorrupt naming what does not match `spec`.
    Its arrays are of the kind the spec's backend uses (`spec.arrays`), as the store decoded them.
    check_values=False skips only the scan for NaN/Inf (a pass over every byte: as long as the restore's
    own copy) for a payload this process already checked: one to_payload made, or read back earlier.
    `checked`: payloads accepted before (a memory tier's, restored again) are rebuilt without their checks."""
    if checked is not None and not check_values:
        state = checked.accepted(tensors, meta, spec)
        if state is not None:
            return state
    backend = written_by(meta)["backend"]
    if backend != spec.backend:
        raise SnapshotMismatch(
            f"snapshot was written by the {backend} backend; the loaded model runs on {spec.backend}, "
            "whose state is not interchangeable with it.",
            hint=f"use it with the model served on {backend}: engramctl daemon stop && engramctl daemon start "
            f"--backend {backend}",
        )
    state_format = meta.get(STATE_FORMAT, "")
    if state_format != spec.state_format:
        raise SnapshotMismatch(
            f"snapshot holds {backend} state format {state_format or 'unversioned'!r} "
            f"(written by version {meta.get('backend_version') or 'unknown'}); this engramctl reads "
            f"{spec.state_format or 'unversioned'!r} (version {spec.backend_version or 'unknown'})."
        )
    if meta.get("dtype") != spec.dtype and spec.backend != "transformers":
        raise SnapshotMismatch(
            f"snapshot was written by a {meta.get('dtype')} model; the loaded model is {spec.dtype}."
        )
    if meta.get("dtype") != spec.dtype:
        raise SnapshotMismatch(
            f"snapshot was written by a {meta.get('dtype')} model; the loaded model runs {spec.dtype}.",
            hint=f"restart with --dtype {meta.get('dtype')} to use it",
        )
    if meta.get("fingerprint") != spec.fingerprint:
        raise SnapshotMismatch(
            f"snapshot belongs to model {meta.get('model_id')!r} (fingerprint {meta.get('fingerprint')}); "
            f"the loaded model {spec.model_id!r} has fingerprint {spec.fingerprint} (different config or weights)."
        )
    layout = _layout(meta.get("layout", "[]"))
    if layout != spec.layout:
        shown = str(list(layout))
        shown = shown if len(shown) <= 200 else shown[:197] + "..."
        raise SnapshotMismatch(f"snapshot layer layout {shown} differs from the model's {list(spec.layout)}.")
    try:
        n_tokens = int(meta["n_tokens"])
    except (KeyError, ValueError):
        raise SnapshotCorrupt("snapshot metadata has no valid n_tokens.") from None
    ids = tensors.get(TOKEN_IDS)
    if ids is None or arrays.dtype_name(ids) != "int64" or arrays.shape(ids) != (n_tokens,):
        raise SnapshotCorrupt(f"snapshot token ids do not match its token count {n_tokens}.")
    # The ids are compared with prompts and decoded as text later: one outside the vocabulary would
    # fail there, in the middle of a turn, instead of here where the session can fall back.
    if n_tokens and (int(ids.min()) < 0 or int(ids.max()) >= spec.vocab_size):
        raise SnapshotCorrupt(
            f"snapshot token ids run from {int(ids.min())} to {int(ids.max())}, "
            f"outside the model's vocabulary of {spec.vocab_size}."
        )
    logits = tensors.get(LAST_LOGITS)
    if logits is None or arrays.shape(logits) != (spec.vocab_size,) or arrays.dtype_name(logits) != "float32":
        raise SnapshotMismatch(f"snapshot last logits do not match the model's vocabulary of {spec.vocab_size}.")
    expected_names = {TOKEN_IDS, LAST_LOGITS}
    for i, layer_spec in enumerate(spec.layers):
        for name, ts in layer_spec.tensors.items():
            key = f"layers.{i}.{name}"
            expected_names.add(key)
            t = tensors.get(key)
            if t is None:
                raise SnapshotMismatch(f"snapshot lacks tensor {key} that the model's layer {i} needs.")
            if arrays.dtype_name(t) != ts.dtype or arrays.shape(t) != ts.shape_at(n_tokens):
                raise SnapshotMismatch(
                    f"snapshot tensor {key} is {arrays.dtype_name(t)}{list(t.shape)}; "
                    f"the model needs {ts.dtype}{list(ts.shape_at(n_tokens))}."
                )
    extra = set(tensors) - expected_names
    if extra:
        raise SnapshotMismatch(f"snapshot has tensors the model does not use: {sorted(extra)[:4]}.")
    if check_values:
        _check_finite(tensors, "snapshot")
    state = _build(tensors, meta, spec, n_tokens)
    if checked is not None:
        checked.accept(tensors, meta, spec, state)
    return state


def _build(tensors: dict[str, Array], meta: dict[str, str], spec: StateSpec, n_tokens: int) -> SessionState:
    """The SessionState of a payload from_payload has checked against `spec`."""
    layers = []
    for i, layer_spec in enumerate(spec.layers):
        own = {name: arrays.as_kind(tensors[f"layers.{i}.{name}"], spec.arrays) for name in layer_spec.tensors}
        layers.append(LAYER_KINDS[layer_spec.kind].from_tensors(own))
    return SessionState(
        layers=tuple(layers),
        token_ids=tuple(tensors[TOKEN_IDS].tolist()),
        last_logits=arrays.as_kind(tensors[LAST_LOGITS], spec.arrays),
        text=meta.get("text", ""),
    )


# what from_payload reads of a payload's metadata: a payload accepted before is accepted again only with these same
_CHECKED_META = (BACKEND, STATE_FORMAT, "dtype", "fingerprint", "layout", "n_tokens", "text")


class Checked:
    """Payloads from_payload accepted for a spec, known by their arrays' identity: a payload restored again from a
    memory tier (the same dict of the same arrays) gives the SessionState built from it the first time, without
    checking its metadata and every tensor again (~1.5 ms of dtype names and shapes for a 64-layer hybrid, against a
    7 ms floor for its whole restore at 2K tokens: scripts/bench_restore.py) nor building it again (~1 ms more: a
    layer object per layer, the token ids as a tuple). A SessionState is immutable (frozen, tuples), its arrays are
    the payload's own, and it is kept only while the payload is: it is dropped when the payload's token ids array is
    collected (the memory tier let the payload go).

    What is checked once cannot have changed since: the payload's arrays are the very objects accepted (held weakly:
    a payload collected is forgotten, and a new array at a reused address is a new object), their shape and dtype
    are compared again here (an in-place reshape would show), a numpy array's memory cannot be rebound (numpy 2
    refuses `a.data = ...`), and nothing in engramctl writes a payload's arrays once made (a capture's views of its
    blob, a read's views of the buffer it read into: the backend loads those bytes as they lie). The metadata read
    is compared field by field. Torch payloads are not remembered: a tensor's memory can be rebound (`.data`).
    At most `keep` payloads are remembered, the least recently accepted forgotten first."""

    def __init__(self, keep: int = 64):
        self.keep = keep
        # id of the payload's token ids array -> (spec, metadata read, [(name, weakref, shape, dtype)] in order, the
        # SessionState built from it)
        self._seen: collections.OrderedDict[int, tuple] = collections.OrderedDict()
        self.hits = 0

    def accepted(self, tensors: dict[str, Array], meta: dict[str, str], spec: StateSpec) -> SessionState | None:
        """The SessionState built when this very payload was accepted for `spec`; None when it was not."""
        ids = tensors.get(TOKEN_IDS)
        seen = self._seen.get(id(ids)) if ids is not None else None
        if seen is None:
            return None
        was_spec, was_meta, refs, state = seen
        if was_spec is not spec or len(refs) != len(tensors) or was_meta != tuple(map(meta.get, _CHECKED_META)):
            return None
        for (name, ref, shape, dtype), (now_name, t) in zip(refs, tensors.items()):
            if ref() is not t or name != now_name or t.shape != shape or t.dtype != dtype:
                return None
        self._seen.move_to_end(id(ids))
        self.hits += 1
        return state

    def accept(self, tensors: dict[str, Array], meta: dict[str, str], spec: StateSpec, state: SessionState) -> None:
        if not all(arrays.is_numpy(t) for t in tensors.values()):
            return
        ids = tensors[TOKEN_IDS]
        refs = [(name, weakref.ref(t), t.shape, t.dtype) for name, t in tensors.items()]
        self._seen[id(ids)] = (spec, tuple(map(meta.get, _CHECKED_META)), refs, state)
        self._seen.move_to_end(id(ids))
        # the state holds the payload's arrays: it goes with the payload, not when `keep` newer ones push it out
        weakref.finalize(ids, self._seen.pop, id(ids), None)
        while len(self._seen) > self.keep:
            self._seen.popitem(last=False)
